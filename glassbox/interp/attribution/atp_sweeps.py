"""Named attribution-patching estimates, one per patching sweep, with the sweep's axes.

Each takes ``(model, clean_tokens, corrupted_tokens, metric, **options)`` (options as in
``attribution_patch``: clean_cache, corrupted_cache, attention_mask, reduce, method="atp*" and its
options) and returns a ``PatchResult`` with the axes and labels of the sweep it estimates:

| function | estimates | axes |
| --- | --- | --- |
| atp_resid_pre / _mid / _post, atp_attn_out, atp_mlp_out | patch_resid_pre / ... | layer pos |
| atp_head_z / _q / _k / _v / _pattern | patch_head_z / ... | layer head |
| atp_head_z_by_pos / _q / _k / _v | patch_head_z_by_pos / ... | layer pos head |
| atp_head_pattern_by_pos | patch_head_pattern_by_pos | layer head query_pos |
| atp_neurons / _by_pos | (no sweep) one MLP neuron at all positions / at one | layer (pos) neuron |
| atp_block_every, atp_head_every, atp_head_every_by_pos | patch_block_every / ... | component ... |

Grouped-query attention: the k and v estimates are per key/value head (axis ``kv_head``), as the
sweeps; the stacked head estimates are refused there as the sweeps are.
"""

from typing import Callable

from ...models.hook_shapes import hook_shape
from ..patching.result import PatchResult
from .atp import attribution_patch
from .nodes import ATP_ACTIVATIONS


def _estimate(activation, axes: tuple, doc: str) -> Callable:
    def estimate(model, clean_tokens, corrupted_tokens, metric: Callable, **options) -> PatchResult:
        return attribution_patch(model, clean_tokens, corrupted_tokens, metric, activation,
                                 kv_axes(model, activation, axes), **options)

    estimate.__doc__ = f"{doc} Returns a PatchResult [{' '.join(axes)}]."
    return estimate


def kv_axes(model, activation, axes: tuple) -> tuple:
    """``axes`` with "head" read as "kv_head" for one activation whose hook has that axis."""
    if not isinstance(activation, str) or "head" not in axes:
        return axes
    name = ATP_ACTIVATIONS.get(activation, activation).format(L=0)
    if "kv_head" not in hook_shape(name, model.hook_flags, model.cfg).split():
        return axes
    return tuple("kv_head" if a == "head" else a for a in axes)


BY_POSITION = ("layer", "pos")
BY_HEAD = ("layer", "head")
BY_POSITION_AND_HEAD = ("layer", "pos", "head")

atp_resid_pre = _estimate("resid_pre", BY_POSITION, "AtP of patching the residual stream entering each block.")
atp_resid_mid = _estimate("resid_mid", BY_POSITION, "AtP of patching the residual stream between attention and MLP.")
atp_resid_post = _estimate("resid_post", BY_POSITION, "AtP of patching the residual stream leaving each block.")
atp_attn_out = _estimate("attn_out", BY_POSITION, "AtP of patching each attention layer's output, by position.")
atp_mlp_out = _estimate("mlp_out", BY_POSITION, "AtP of patching each MLP layer's output, by position.")

atp_head_z = _estimate("z", BY_HEAD, "AtP of patching each head's output z at every position at once.")
atp_head_q = _estimate("q", BY_HEAD, "AtP of patching each head's queries at every position at once.")
atp_head_k = _estimate("k", BY_HEAD, "AtP of patching each head's keys at every position at once.")
atp_head_v = _estimate("v", BY_HEAD, "AtP of patching each head's values at every position at once.")
atp_head_pattern = _estimate("pattern", BY_HEAD, "AtP of patching each head's whole attention pattern.")

atp_head_z_by_pos = _estimate("z", BY_POSITION_AND_HEAD, "AtP of patching each head's z, one position at a time.")
atp_head_q_by_pos = _estimate("q", BY_POSITION_AND_HEAD, "AtP of patching each head's query, one position at a time.")
atp_head_k_by_pos = _estimate("k", BY_POSITION_AND_HEAD, "AtP of patching each head's key, one position at a time.")
atp_head_v_by_pos = _estimate("v", BY_POSITION_AND_HEAD, "AtP of patching each head's value, one position at a time.")
atp_head_pattern_by_pos = _estimate("pattern", ("layer", "head", "query_pos"),
                                    "AtP of patching one query row of each head's attention pattern at a time.")

atp_neurons = _estimate("mlp_post", ("layer", "neuron"), "AtP of patching each MLP neuron at every position at once.")
atp_neurons_by_pos = _estimate("mlp_post", ("layer", "pos", "neuron"),
                               "AtP of patching each MLP neuron, one position at a time.")

atp_block_every = _estimate(["resid_pre", "attn_out", "mlp_out"], BY_POSITION,
                            "AtP of the resid_pre, attn_out and mlp_out sweeps by position, stacked.")
atp_head_every = _estimate(["z", "q", "k", "v", "pattern"], BY_HEAD,
                           "AtP of the z, q, k, v and pattern sweeps over heads (all positions), stacked.")
atp_head_every_by_pos = _estimate(["z", "q", "k", "v"], BY_POSITION_AND_HEAD,
                                  "AtP of the z, q, k and v sweeps by position and head, stacked.")

for _name, _fn in list(globals().items()):
    if _name.startswith("atp_") and callable(_fn) and _name != "atp_sweeps":
        _fn.__name__ = _fn.__qualname__ = _name
