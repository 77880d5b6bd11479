"""Norms that sit between a sublayer and the residual stream, and each part's exact share of them.

In a pre-norm (or parallel) block the attention and MLP outputs are added to the residual stream as
they are. Two placements normalise them first:

- "sandwich" (Gemma 2 and 3): hook_attn_out = ln1_post(attention output), hook_mlp_out =
  ln2_post(MLP output);
- "output" (OLMo 2): hook_attn_out = ln1(attention output), hook_mlp_out = ln2(MLP output); no norm
  reads the residual stream inside a block (only ln_final, before the unembedding).

resid_post = resid_pre + attn_out + mlp_out still holds in both, so residual decompositions into
hook_attn_out / hook_mlp_out rows are exact. A single head's (or neuron's) write is not what reaches
the stream, though: the norm rescales the sum of all of them. Given the scale the forward used
(cached at the norm's ``hook_scale``), the norm is linear, so each part gets its exact share

    share(c) = (c - mean(c)) / scale * (offset + w)     (RMSNorm: no mean; LayerNorm: offset 0)

and the norm's bias b (LayerNorm only) is one more part. The shares of a sublayer's parts plus b sum
to its hook_attn_out / hook_mlp_out. ``share`` needs the norm's hook_scale in the cache.
"""

from typing import Optional

import torch
from torch import Tensor

POST_NORMS = {"sandwich": {"attn": "ln1_post", "mlp": "ln2_post"}, "output": {"attn": "ln1", "mlp": "ln2"}}


def norm_weight(norm, like: Tensor) -> Tensor:
    """The factor a norm multiplies its normalised input by: (offset + w) (cfg.norm_weight_offset,
    Gemma's 1.0, for RMSNorm), or w."""
    return (float(getattr(norm, "offset", 0.0)) + norm.w.detach()).to(like.device, like.dtype)


def norm_bias(norm, like: Tensor) -> Optional[Tensor]:
    b = getattr(norm, "b", None)
    return None if b is None else b.detach().to(like.device, like.dtype)


def sublayer_norm(model, layer: int, part: str) -> Optional[tuple]:
    """(norm module, its hook_scale name) between block ``layer``'s ``part`` ("attn" | "mlp") and the
    residual stream; None where the sublayer's output is added as it is."""
    names = POST_NORMS.get(model.cfg.norm_placement)
    if names is None or model.cfg.parallel_attn_mlp or model.cfg.attn_only:
        return None
    name = names[part]
    return getattr(model.blocks[layer], name), f"blocks.{layer}.{name}.hook_scale"


def cached_scale(cache, layer: int, part: str, scale_name: str, like: Tensor) -> Tensor:
    if scale_name not in cache:
        raise KeyError(f"norm_placement={cache.model.cfg.norm_placement!r}: block {layer}'s {part} output is "
                       f"normalised before it reaches the residual stream, so each part's share needs "
                       f"{scale_name} in the cache")
    return cache[scale_name].to(like.device, like.dtype)  # [*batch pos 1]


def share(cache, layer: int, part: str, writes: Tensor, parts_axis: bool = True) -> Tensor:
    """Each write's exact share of the sublayer's norm (``writes`` [*batch pos (part) d_model] at every
    cached position, the part axis present with ``parts_axis``); ``writes`` as they are where no norm
    follows the sublayer."""
    found = sublayer_norm(cache.model, layer, part)
    if found is None:
        return writes
    norm, scale_name = found
    scale = cached_scale(cache, layer, part, scale_name, writes)
    if parts_axis:
        scale = scale[..., None, :]
    if cache.model.cfg.normalization == "LN":
        writes = writes - writes.mean(-1, keepdim=True)
    return writes / scale * norm_weight(norm, writes)


def fold_into_writer(cache, layer: int, part: str, acts: Tensor, W: Tensor, pos_slice=None) -> tuple:
    """(acts', W') with acts'[..., n] * W'[n] the share of the write acts[..., n] * W[n] (acts
    [*batch pos n] cut by ``pos_slice``, W [n d_model]): the norm folded in without forming the writes."""
    found = sublayer_norm(cache.model, layer, part)
    if found is None:
        return acts, W
    from .slices import slice_pos

    norm, scale_name = found
    scale = slice_pos(cache, cached_scale(cache, layer, part, scale_name, acts), pos_slice)
    if cache.model.cfg.normalization == "LN":
        W = W - W.mean(-1, keepdim=True)
    return acts / scale, W * norm_weight(norm, W)


def bias_share(cache, layer: int, part: str, bias: Optional[Tensor], like: Tensor) -> Tensor:
    """A sublayer's output bias (None: zero) as it reaches the stream, [*batch pos d_model] like
    ``like``; through the norm (its share, plus the norm's own bias) where one follows the sublayer."""
    d_model = cache.model.cfg.d_model
    b = torch.zeros(d_model, device=like.device, dtype=like.dtype) if bias is None else bias.detach().to(
        like.device, like.dtype)
    found = sublayer_norm(cache.model, layer, part)
    if found is None:
        return b.expand(*like.shape[:-1], d_model)
    out = share(cache, layer, part, b.expand(*like.shape[:-1], d_model).contiguous(), parts_axis=False)
    own = norm_bias(found[0], like)
    return out if own is None else out + own
