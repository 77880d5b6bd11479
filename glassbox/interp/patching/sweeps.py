"""Named activation-patching sweeps, with TransformerLens's meanings and result axes.

Each takes ``(model, corrupted_tokens, clean_cache, metric, **options)`` (options as in
``activation_patch``, ``fwd_hooks=`` included: user hooks attached for the sweep, see
``user_hooks.py``) and returns a ``PatchResult``:

| function | TransformerLens | axes |
| --- | --- | --- |
| patch_resid_pre / _mid / _post | get_act_patch_resid_pre / ... | layer pos |
| patch_attn_out, patch_mlp_out | get_act_patch_attn_out, ..._mlp_out | layer pos |
| patch_head_z / _q / _k / _v / _pattern | get_act_patch_attn_head_out_all_pos, ..._q_all_pos, ... | layer head |
| patch_head_z_by_pos / _q / _k / _v | get_act_patch_attn_head_out_by_pos, ... | layer pos head |
| patch_head_pattern_by_pos | get_act_patch_attn_head_pattern_by_pos | layer head query_pos |
| patch_block_every | get_act_patch_block_every | component(resid_pre attn_out mlp_out) layer pos |
| patch_head_every | get_act_patch_attn_head_all_pos_every | component(z q k v pattern) layer head |
| patch_head_every_by_pos | get_act_patch_attn_head_by_pos_every | component(z q k v) layer pos head |

Grouped-query attention (``cfg.n_key_value_heads`` < n_heads, keys and values not ungrouped): the
k and v sweeps sweep key/value heads, axis ``kv_head`` (labels "i (q a-b)": the query heads reading
kv head i), since one kv head's keys or values are read by all its query heads at once; q, z and
pattern stay per query head. ``patch_head_every`` and ``patch_head_every_by_pos`` stack q and k on one
head axis, so they are refused there, naming the option; sweep k and v on their own, or build the
model with ``ungroup_grouped_query_attention=True`` (hooks per query head).

"All positions" head sweeps patch the head at every position at once; "by pos" sweeps patch one
position (for the pattern: one query row) at a time. TransformerLens's
``get_act_patch_attn_head_by_pos_every`` has a fifth component, the pattern by query row;
``glassbox.tl.patching`` adds it from a pattern sweep by query row, so glassbox's own
sweep stays four components.
"""

from collections.abc import Mapping
from typing import Callable

from ...models.hook_shapes import hook_shape
from .engine import activation_patch, resolve_template
from .result import PatchResult


def _sweep(activation, axes: tuple, doc: str) -> Callable:
    def sweep(model, corrupted_tokens, clean_cache: Mapping, metric: Callable, **options) -> PatchResult:
        return activation_patch(model, corrupted_tokens, clean_cache, metric, activation,
                                head_axes(model, activation, axes), **options)

    sweep.__doc__ = f"{doc} Returns a PatchResult [{' '.join(axes)}]."
    return sweep


def head_axes(model, activation, axes: tuple) -> tuple:
    """``axes`` with "head" read as "kv_head" for one activation whose hook has that axis (keys and
    values under grouped-query attention); stacked sweeps keep "head" (and are refused there)."""
    if not isinstance(activation, str) or "head" not in axes:
        return axes
    template = resolve_template(model, activation)
    if "kv_head" not in hook_shape(template.format(L=0), model.hook_flags, model.cfg).split():
        return axes
    return tuple("kv_head" if a == "head" else a for a in axes)


BY_POSITION = ("layer", "pos")
BY_HEAD = ("layer", "head")
BY_POSITION_AND_HEAD = ("layer", "pos", "head")

patch_resid_pre = _sweep("resid_pre", BY_POSITION, "Patch the residual stream entering each block, one position at a time.")
patch_resid_mid = _sweep("resid_mid", BY_POSITION, "Patch the residual stream between attention and MLP, by position.")
patch_resid_post = _sweep("resid_post", BY_POSITION, "Patch the residual stream leaving each block, by position.")
patch_attn_out = _sweep("attn_out", BY_POSITION, "Patch each attention layer's output, by position.")
patch_mlp_out = _sweep("mlp_out", BY_POSITION, "Patch each MLP layer's output, by position.")

patch_head_z = _sweep("z", BY_HEAD, "Patch each head's output z at every position at once.")
patch_head_q = _sweep("q", BY_HEAD, "Patch each head's queries at every position at once.")
patch_head_k = _sweep("k", BY_HEAD, "Patch each head's keys at every position at once.")
patch_head_v = _sweep("v", BY_HEAD, "Patch each head's values at every position at once.")
patch_head_pattern = _sweep("pattern", BY_HEAD, "Patch each head's whole attention pattern.")

patch_head_z_by_pos = _sweep("z", BY_POSITION_AND_HEAD, "Patch each head's output z, one position at a time.")
patch_head_q_by_pos = _sweep("q", BY_POSITION_AND_HEAD, "Patch each head's query, one position at a time.")
patch_head_k_by_pos = _sweep("k", BY_POSITION_AND_HEAD, "Patch each head's key, one position at a time.")
patch_head_v_by_pos = _sweep("v", BY_POSITION_AND_HEAD, "Patch each head's value, one position at a time.")
patch_head_pattern_by_pos = _sweep("pattern", ("layer", "head", "query_pos"),
                                   "Patch one query row of each head's attention pattern at a time.")

patch_block_every = _sweep(["resid_pre", "attn_out", "mlp_out"], BY_POSITION,
                           "resid_pre, attn_out and mlp_out sweeps by position, stacked.")
patch_head_every = _sweep(["z", "q", "k", "v", "pattern"], BY_HEAD,
                          "z, q, k, v and pattern sweeps over heads (all positions), stacked.")
patch_head_every_by_pos = _sweep(["z", "q", "k", "v"], BY_POSITION_AND_HEAD,
                                 "z, q, k and v sweeps by position and head, stacked.")

for _name, _fn in list(globals().items()):
    if _name.startswith("patch_"):
        _fn.__name__ = _fn.__qualname__ = _name
