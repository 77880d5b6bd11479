"""Per-neuron writes to the residual stream: neuron n of block l writes mlp.hook_post[..., n] * W_out[n].

An MLP's output is the sum of its neurons' writes plus b_out (gated MLPs too: hook_post is there the
gated product act(pre) * pre_linear that W_out reads), so ``stack_neuron_results`` summed over a
layer's rows, plus b_out, is that layer's hook_mlp_out. Where a norm follows the MLP (norm_placement
"sandwich": ln2_post; "output": ln2) each write is its exact share of that norm's output at the cached
scale (``sublayer_norm``: needs the norm's hook_scale in the cache), and b_out's share plus the norm's
bias complete hook_mlp_out.

``project_output_onto`` ([d_model] or [d_model n]) contracts each write with directions before the
writes are expanded: hook_post[..., n] * (W_out[n] @ p), so the [..., d_mlp, d_model] stack is never
built. With ``apply_ln`` as well, the norm is folded in the same way, exactly: a write a W_n becomes
a / scale * ((W_n - mean(W_n)) * w) @ p (RMSNorm: no mean), with the cached scale.

Footgun: without a projection, a stack of every neuron is [n_layers * d_mlp, batch, pos, d_model];
for real models pass ``pos_slice``, ``neuron_slice`` or ``project_output_onto``.
"""

from numbers import Integral
from typing import Optional

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from . import sublayer_norm
from .resid import apply_ln_to_stack, attn_only, check_stream, norm_at, stream_at
from .slices import Index, PosSlice, block_layer, index_axis, neuron_labels, slice_pos, stream_layer


def get_neuron_results(cache, layer, neuron_slice: Index = None, pos_slice: PosSlice = None,
                       project_output_onto: Optional[Tensor] = None) -> Tensor:
    """Each neuron's write at block ``layer`` (negative counts from the end): [*batch_and_pos neuron
    d_model], or [... neuron n] / [... neuron] projected onto a [d_model n] / [d_model] tensor. An int
    ``neuron_slice`` drops the neuron axis. Needs mlp.hook_post in the cache; nothing is cached."""
    model = cache.model
    _check_mlps(model)
    layer = block_layer(model.cfg, layer)
    acts = index_axis(slice_pos(cache, cache[("post", layer)], pos_slice), neuron_slice, -1, "neuron_slice")
    W_out = index_axis(model.blocks[layer].mlp.W_out.detach().to(acts.device, acts.dtype), neuron_slice, 0,
                       "neuron_slice")
    acts, W_out = sublayer_norm.fold_into_writer(cache, layer, "mlp", acts, W_out, pos_slice)
    if project_output_onto is None:
        return acts[..., None] * W_out
    p = _directions(project_output_onto, model.cfg.d_model, acts)
    return acts * (W_out @ p) if p.ndim == 1 else acts[..., None] * (W_out @ p)


def stack_neuron_results(cache, layer, pos_slice: PosSlice = None, neuron_slice: Index = None,
                         return_labels: bool = False, incl_remainder: bool = False, apply_ln: bool = False,
                         project_output_onto: Optional[Tensor] = None, affine: bool = True,
                         mlp_input: bool = False):
    """Every neuron's write for the blocks before stream position ``layer``: [layer*neuron
    *batch_and_pos d_model] (or the projection's last axis), labels "L{l}N{n}".

    An int ``neuron_slice`` keeps one row per layer. ``incl_remainder`` appends "remainder", the stream
    entering ``layer`` minus every neuron's write (so the rows sum to that stream); ``apply_ln`` applies
    the norm at ``layer`` as ``apply_ln_to_stack`` does (``affine`` too), folded into the projection
    when there is one. ``mlp_input``: the norm and the remainder are those of ``layer``'s MLP input
    (ln2, resid_mid) rather than its attention input.
    """
    model = cache.model
    _check_mlps(model)
    layer = stream_layer(model.cfg, layer)
    if incl_remainder or apply_ln:
        check_stream(cache, layer, mlp_input)  # a remainder or a norm needs a stream of summed outputs
    if isinstance(neuron_slice, (Integral, np.integer)) or (isinstance(neuron_slice, Tensor)
                                                            and neuron_slice.ndim == 0):
        neuron_slice = [int(neuron_slice)]  # one row per layer, as an index list of one
    labels = neuron_labels(range(layer), model.cfg.d_mlp, neuron_slice)
    reference = slice_pos(cache, stream_at(cache, layer, mlp_input), pos_slice)
    p = None if project_output_onto is None else _directions(project_output_onto, model.cfg.d_model, reference)
    p2 = None if p is None else (p[:, None] if p.ndim == 1 else p)
    fold = apply_ln and p2 is not None
    rows = []
    for l in range(layer):
        if fold:
            rows.append(_ln_projected(cache, l, layer, mlp_input, neuron_slice, pos_slice, p2, affine))
        else:
            rows.append(get_neuron_results(cache, l, neuron_slice, pos_slice, p2))
    width = model.cfg.d_model if p2 is None else p2.shape[-1]
    stack = torch.cat(rows, -2).movedim(-2, 0) if rows else reference.new_zeros((0, *reference.shape[:-1], width))
    if incl_remainder:
        stream = reference
        if fold:
            stream = apply_ln_to_stack(cache, stream[None], layer, mlp_input, pos_slice, affine=affine)[0]
        if p2 is not None:
            stream = stream @ p2
        stack, labels = torch.cat([stack, (stream - stack.sum(0))[None]]), [*labels, "remainder"]
    if apply_ln and not fold:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input, pos_slice, affine=affine)
    if p is not None and p.ndim == 1:
        stack = stack[..., 0]
    return (stack, labels) if return_labels else stack


def _ln_projected(cache, l: int, layer: int, mlp_input: bool, neuron_slice, pos_slice, p2: Tensor,
                  affine: bool) -> Tensor:
    """Block l's neuron writes through the norm at ``layer`` and onto p2, never in d_model per neuron."""
    norm, scale_name = norm_at(cache, layer, mlp_input)
    acts = index_axis(slice_pos(cache, cache[("post", l)], pos_slice), neuron_slice, -1, "neuron_slice")
    scale = slice_pos(cache, cache[scale_name], pos_slice).to(acts.device, acts.dtype)
    W = index_axis(cache.model.blocks[l].mlp.W_out.detach().to(acts.device, acts.dtype), neuron_slice, 0,
                   "neuron_slice")
    acts, W = sublayer_norm.fold_into_writer(cache, l, "mlp", acts, W, pos_slice)  # sandwich/output norms
    if cache.model.cfg.normalization == "LN":
        W = W - W.mean(-1, keepdim=True)
    if affine:
        W = W * sublayer_norm.norm_weight(norm, W)
    return (acts / scale)[..., None] * (W @ p2)


def _check_mlps(model) -> None:
    if attn_only(model):
        raise ValueError("an attention-only model has no MLP neurons (cfg.attn_only=True)")


def _directions(p: Tensor, d_model: int, like: Tensor) -> Float[Tensor, "d_model ..."]:
    if not isinstance(p, Tensor) or p.ndim not in (1, 2) or p.shape[0] != d_model:
        shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
        raise ValueError(f"project_output_onto must be a [d_model={d_model}] or [d_model n] tensor, got {shape}")
    return p.to(like.device, like.dtype)
