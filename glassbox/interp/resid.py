"""The residual stream taken apart: logit lens, decompositions, per-head writes and logit attribution.

TransformerLens's names, labels and meanings (``accumulated_resid``, ``decompose_resid``,
``stack_head_results``, ``apply_ln_to_stack``, ``logit_attrs``), with one difference: nothing relies
on LayerNorm having been folded into the weights. A norm is applied exactly:

    norm(x) = (x - mean(x)) / scale * w + b          (RMSNorm: no centering, no b)

where ``scale`` is the divisor the forward pass used (cached at ``hook_scale``). For a stack of
components summing to x, centering and dividing by that cached scale are linear, so each component
gets (c - mean(c)) / scale * w, and the bias b is one more component of its own. Summing all of them
gives the norm's output exactly, and logit attributions sum to the logits (or logit difference).

``pos_slice`` picks positions from cached activations and from the cached scale: an int, a slice, a
list/tensor of positions, or "last" (each sequence's last real token, from the cache's attention
mask, so a padded batch never reads a pad).

Footguns: the weights are the model's current ones; post-norm models are refused (their residual
stream is renormalised in every block, so it is not a sum of component outputs); ``apply_ln=True`` on a
decomposition returns the linear parts only (the bias is ``incl_bias`` of ``apply_ln_to_stack``).
"""

from typing import Optional, Union

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from ..models.generate import last_token_positions

PosSlice = Union[None, int, slice, list, Tensor, str]
BIAS_LABEL = "ln_final.b"


# -- the norm reading the residual stream at a layer ------------------------------------------
def norm_at(cache, layer: Optional[int], mlp_input: bool = False) -> tuple:
    """(norm module, name of its cached scale) for the norm that reads the stream entering ``layer``."""
    model = cache.model
    n_layers = model.cfg.n_layers
    if model.cfg.norm_placement != "pre":
        raise ValueError("post-norm models renormalise the residual stream in every block; residual "
                         "decompositions and norm attribution do not apply to them")
    if layer is None or layer in (-1, n_layers):
        return model.ln_final, "ln_final.hook_scale"
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer={layer} is outside [0, n_layers={n_layers}]")
    if mlp_input and getattr(model.cfg, "parallel_attn_mlp", False):
        raise ValueError("parallel blocks have no MLP-input residual stream (mlp_input=True)")
    return (model.blocks[layer].ln2, f"blocks.{layer}.ln2.hook_scale") if mlp_input else \
        (model.blocks[layer].ln1, f"blocks.{layer}.ln1.hook_scale")


def slice_pos(cache, t: Tensor, pos_slice: PosSlice) -> Tensor:
    """Positions of an activation whose pos axis is second to last ([batch pos d] or [pos d])."""
    if pos_slice is None:
        return t
    if isinstance(pos_slice, str):
        if pos_slice != "last":
            raise ValueError(f"pos_slice must be an int, slice, positions or 'last', got {pos_slice!r}")
        mask = cache.attention_mask
        pos = t.shape[-2]
        if mask is None:
            return t[..., -1, :]
        last = last_token_positions(mask.to(t.device), pos)
        if cache.has_batch_dim:
            return t[torch.arange(t.shape[0], device=t.device), last]
        return t[..., int(last[0]), :]
    if isinstance(pos_slice, int):
        return t[..., pos_slice, :]
    if isinstance(pos_slice, slice):
        return t[..., pos_slice, :]
    index = torch.as_tensor(pos_slice, device=t.device)
    return t.index_select(-2, index)


def _stack(tensors: list, labels: list, return_labels: bool):
    stack = torch.stack(tensors)
    return (stack, labels) if return_labels else stack


# -- stacks of residual-stream vectors ---------------------------------------------------------
def accumulated_resid(cache, layer: Optional[int] = None, incl_mid: bool = False, apply_ln: bool = False,
                      pos_slice: PosSlice = None, mlp_input: bool = False, return_labels: bool = False):
    """The residual stream at each point up to ``layer``: [component *batch_and_pos d_model].

    Labels "0_pre", "0_mid" (with ``incl_mid``), "1_pre", ..., "final_post" (when ``layer`` is None or
    n_layers). ``apply_ln`` normalises each entry by its own statistics with the weights of the norm
    that reads the stream at ``layer`` (ln_final for the last layer): the logit lens. Unembedding the
    "final_post" entry gives the model's logits.
    """
    n_layers = cache.model.cfg.n_layers
    layer = n_layers if layer is None or layer == -1 else layer
    if not 0 <= layer <= n_layers:
        raise ValueError(f"layer={layer} is outside [0, n_layers={n_layers}]")
    tensors, labels = [], []
    for l in range(layer + 1):
        if l == n_layers:
            tensors.append(cache[("resid_post", n_layers - 1)])
            labels.append("final_post")
            continue
        tensors.append(cache[("resid_pre", l)])
        labels.append(f"{l}_pre")
        if (incl_mid and l < layer) or (mlp_input and l == layer):
            tensors.append(cache[("resid_mid", l)])
            labels.append(f"{l}_mid")
    stack = torch.stack([slice_pos(cache, t, pos_slice) for t in tensors])
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, recompute_ln=True)
    return (stack, labels) if return_labels else stack


def decompose_resid(cache, layer: Optional[int] = None, mlp_input: bool = False, mode: str = "all",
                    apply_ln: bool = False, pos_slice: PosSlice = None, incl_embeds: bool = True,
                    return_labels: bool = False):
    """The residual stream entering ``layer`` as a stack of the outputs that wrote it.

    Labels "embed", "pos_embed" (models with a position embedding), then "{l}_attn_out" and
    "{l}_mlp_out" for every earlier layer (and "{layer}_attn_out" with ``mlp_input``). With mode
    "all" and the embeddings, the stack sums to the residual stream. ``apply_ln`` gives each
    component's linear share of the norm at ``layer``; the norm's bias is not in any component.
    """
    if mode not in ("all", "attn", "mlp"):
        raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
    norm_at(cache, layer, mlp_input)  # validates layer and the architecture
    n_layers = cache.model.cfg.n_layers
    layer = n_layers if layer is None or layer == -1 else layer
    tensors, labels = [], []
    if incl_embeds:
        for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
            if name in cache.model.hook_dict:
                tensors.append(cache[name])
                labels.append(label)
    for l in range(layer + (1 if mlp_input else 0)):
        if mode != "mlp":
            tensors.append(cache[("attn_out", l)])
            labels.append(f"{l}_attn_out")
        if mode != "attn" and l < layer:
            tensors.append(cache[("mlp_out", l)])
            labels.append(f"{l}_mlp_out")
    if not tensors:
        raise ValueError(f"nothing to decompose for layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}")
    stack = torch.stack([slice_pos(cache, t, pos_slice) for t in tensors])
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, pos_slice=pos_slice)
    return (stack, labels) if return_labels else stack


def stack_head_results(cache, layer: Optional[int] = None, return_labels: bool = False,
                       incl_b_O: bool = False, pos_slice: PosSlice = None, apply_ln: bool = False):
    """Each head's write to the residual stream, z @ W_O, for the layers before ``layer``.

    [layer*head *batch_and_pos d_model], labels "L{l}H{h}". The output bias b_O belongs to no head:
    with ``incl_b_O`` it follows each layer's heads as its own row "L{l}_b_O", so a layer's rows sum
    to its hook_attn_out. Needs ``hook_z`` in the cache.
    """
    model = cache.model
    n_layers = model.cfg.n_layers
    layer = n_layers if layer is None or layer == -1 else layer
    if not 0 <= layer <= n_layers:
        raise ValueError(f"layer={layer} is outside [0, n_layers={n_layers}]")
    rows, labels = [], []
    for l in range(layer):
        z = slice_pos(cache, _flat_z(cache[("z", l)]), pos_slice)
        attn = model.blocks[l].attn
        W_O = attn.W_O.detach().to(z.device, z.dtype)
        z = z.unflatten(-1, (model.cfg.n_heads, model.cfg.d_head))
        rows.append(einsum(z, W_O, "... head d_head, head d_head d_model -> head ... d_model"))
        labels += [f"L{l}H{h}" for h in range(model.cfg.n_heads)]
        if incl_b_O:
            b_O = attn.b_O.detach() if attn.b_O is not None else torch.zeros(model.cfg.d_model)
            rows.append(b_O.to(z.device, z.dtype).expand(1, *z.shape[:-2], model.cfg.d_model))
            labels.append(f"L{l}_b_O")
    if not rows:
        raise ValueError("stack_head_results(layer=0) has no heads to stack")
    stack = torch.cat(rows)
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos_slice)
    return (stack, labels) if return_labels else stack


def _flat_z(z: Tensor) -> Tensor:
    """[..., pos, head, d_head] -> [..., pos, head*d_head], so pos is second to last for slicing."""
    return z.flatten(-2)


# -- norms and attribution ---------------------------------------------------------------------
def apply_ln_to_stack(cache, stack: Float[Tensor, "component ..."], layer: Optional[int] = None,
                      mlp_input: bool = False, pos_slice: PosSlice = None, recompute_ln: bool = False,
                      incl_bias: bool = False) -> Float[Tensor, "component_out ..."]:
    """Apply the norm that reads the stream at ``layer`` (ln_final when None) to a stack.

    Default: the stack is a decomposition, so each component is centred and divided by the scale
    the forward pass used (cached; ``pos_slice`` selects its positions to match the stack), then
    multiplied by w. With ``incl_bias`` the bias b follows as one more component, and the rows sum
    to the norm's output exactly. With ``recompute_ln`` each entry is a whole residual stream and is
    normalised by its own statistics, w and b included.
    """
    norm, scale_name = norm_at(cache, layer, mlp_input)
    center = cache.model.cfg.normalization == "LN"
    w = norm.w.detach().to(stack.device, stack.dtype)
    b = getattr(norm, "b", None)
    b = b.detach().to(stack.device, stack.dtype) if b is not None else torch.zeros_like(w)
    x = stack - stack.mean(-1, keepdim=True) if center else stack
    if recompute_ln:
        if incl_bias:
            raise ValueError("recompute_ln normalises whole streams; each already includes the bias")
        return x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * w + b
    scale = slice_pos(cache, cache[scale_name], pos_slice).to(stack.device, stack.dtype)
    if scale.shape[:-1] != stack.shape[1:-1]:
        raise ValueError(f"the stack's positions {tuple(stack.shape[1:-1])} do not match the cached scale "
                         f"{tuple(scale.shape[:-1])} of {scale_name}; pass the pos_slice the stack was cut with")
    out = x / scale * w
    if incl_bias:
        out = torch.cat([out, b.expand(1, *out.shape[1:])])
    return out


def logit_attrs(cache, stack: Float[Tensor, "component ..."], tokens, incorrect_tokens=None,
                pos_slice: PosSlice = None, incl_bias: bool = True) -> Float[Tensor, "component_out ..."]:
    """Direct logit attribution: each component's share of the logit of ``tokens``.

    The stack is in residual-stream space (not normalised). Each component passes through the final
    norm exactly (see ``apply_ln_to_stack``) and is dotted with the token's unembedding direction.
    With ``incl_bias`` (default) one more row is appended: the norm's bias (plus any unembedding
    bias), so the rows sum to the model's logit, or logit difference with ``incorrect_tokens``.

    ``tokens``: a str or int (one token everywhere), or a tensor whose shape is a prefix of the
    stack's batch/pos axes (e.g. [batch] for a stack at one position, [batch pos] for all). Ids must
    lie in [0, d_vocab): a negative id is refused, not read from the end of the vocabulary.
    """
    scaled = apply_ln_to_stack(cache, stack, None, pos_slice=pos_slice, incl_bias=incl_bias)
    ids = _token_ids(cache.model, tokens, scaled.device)
    attrs = _dot_unembed(cache.model, scaled, ids, incl_bias)
    if incorrect_tokens is not None:
        wrong = _token_ids(cache.model, incorrect_tokens, scaled.device)
        if wrong.shape != ids.shape:
            raise ValueError(f"tokens {tuple(ids.shape)} and incorrect_tokens {tuple(wrong.shape)} differ in shape")
        attrs = attrs - _dot_unembed(cache.model, scaled, wrong, incl_bias)
    return attrs


def _token_ids(model, tokens, device) -> Int[Tensor, "..."]:
    if isinstance(tokens, str):
        tokens = model.to_single_token(tokens)
    ids = torch.as_tensor(tokens, device=device)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"tokens must be token ids, got dtype {ids.dtype}")
    d_vocab = model.cfg.d_vocab
    # Indexing would wrap a negative id to the end of the vocabulary (and fail deep inside on a large one).
    bad = ids[(ids < 0) | (ids >= d_vocab)]
    if bad.numel():
        raise ValueError(f"token id {int(bad.flatten()[0])} is outside [0, d_vocab={d_vocab}): logit_attrs takes "
                         "token ids or single-token strings, not positions")
    return ids.long()


def _dot_unembed(model, scaled: Tensor, ids: Tensor, bias_row: bool) -> Tensor:
    """Each row of ``scaled`` [component *rest d_model] dotted with W_U[:, ids]; the bias row gets b_U."""
    rest = scaled.shape[1:-1]
    if tuple(ids.shape) != tuple(rest[: ids.ndim]):
        raise ValueError(f"tokens of shape {tuple(ids.shape)} do not match the stack's batch/pos axes "
                         f"{tuple(rest)} (a prefix of them is allowed)")
    directions = model.W_U.detach().T.to(scaled.device, scaled.dtype)[ids]  # [*ids d_model]
    directions = directions.reshape(*ids.shape, *([1] * (len(rest) - ids.ndim)), -1)
    attrs = (scaled * directions).sum(-1)
    b_U = getattr(model.unembed, "b_U", None)
    if b_U is not None and bias_row:
        bias = b_U.detach().to(scaled.device, scaled.dtype)[ids]
        attrs[-1] = attrs[-1] + bias.reshape(*ids.shape, *([1] * (len(rest) - ids.ndim)))
    return attrs
