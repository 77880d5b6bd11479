"""The residual stream taken apart: logit lens, decompositions, norms and logit attribution.

TransformerLens's names, labels and meanings (``accumulated_resid``, ``decompose_resid``,
``apply_ln_to_stack``, ``logit_attrs``; per-head writes are in ``head_results``, per-neuron ones in
``neurons``, the full decomposition in ``decomposition``), with one difference: nothing relies on
LayerNorm having been folded into the weights. A norm is applied exactly:

    norm(x) = (x - mean(x)) / scale * w + b          (RMSNorm: no centering, no b)

where ``scale`` is the divisor the forward pass used (cached at ``hook_scale``; nothing here reads
``hook_normalized``, whose meaning differs between versions). For a stack of components summing to x,
centering and dividing by that cached scale are linear, so each component gets
(c - mean(c)) / scale * w, and the bias b is one more component of its own. Summing all of them gives
the norm's output exactly, and logit attributions sum to the logits (or logit difference).
``affine=False`` gives TransformerLens's (c - mean(c)) / scale instead, without w and b.

Layer arguments are stream positions and index arguments follow ``slices`` (negative and 0-d tensor
layers; int, slice, indices, bool masks and "last" for positions).

Families: sandwich and output-norm blocks (Gemma 2/3, OLMo 2) add normalised sublayer outputs, so
resid_post = resid_pre + attn_out + mlp_out holds and their streams decompose (per-head writes are then
each head's share of the post-sublayer norm, see ``sublayer_norm``); in output-norm blocks no norm
reads the stream, so only ln_final applies. RMSNorm's weight offset (Gemma) is used: w is (offset + w).
Soft-capped logits are refused by ``logit_attrs`` unless ``pre_cap`` (see there).

Footguns: the weights are the model's current ones; post-norm models are refused (their residual
stream is renormalised in every block, so it is not a sum of component outputs); ``apply_ln=True`` on a
decomposition returns the linear parts only (the bias is ``incl_bias`` of ``apply_ln_to_stack``).
"""

from numbers import Integral

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from . import sublayer_norm
from .slices import PosSlice, index_axis, slice_pos, stream_layer

BIAS_LABEL = "ln_final.b"


# -- the norm reading the residual stream at a layer ------------------------------------------
def check_stream(cache, layer, mlp_input: bool = False) -> int:
    """The stream position ``layer`` (see ``slices``), checked to be a sum of component outputs there.

    Post-norm models are refused (their blocks renormalise the residual stream). Sandwich and
    output-norm blocks (Gemma 2/3, OLMo 2) normalise each sublayer's output before adding it, so
    resid_post = resid_pre + attn_out + mlp_out still holds and their streams decompose.
    """
    model = cache.model
    if model.cfg.norm_placement == "post":
        raise ValueError("post-norm models renormalise the residual stream in every block; residual "
                         "decompositions and norm attribution do not apply to them (norm_placement='post')")
    layer = stream_layer(model.cfg, layer)
    if mlp_input and getattr(model.cfg, "parallel_attn_mlp", False):
        raise ValueError("parallel blocks have no MLP-input residual stream (mlp_input=True)")
    if mlp_input and attn_only(model):
        raise ValueError("attention-only blocks have no MLP, so no MLP-input residual stream (mlp_input=True)")
    return layer


def norm_at(cache, layer, mlp_input: bool = False) -> tuple:
    """(norm module, name of its cached scale) for the norm that reads the stream entering ``layer``
    (a stream position, see ``slices``: None or -1 is ln_final).

    Output-norm blocks (norm_placement "output", OLMo 2) have no norm reading the stream inside a
    block (ln1 and ln2 normalise the sublayers' outputs): there every layer but the last is refused.
    """
    model = cache.model
    n_layers = model.cfg.n_layers
    layer = check_stream(cache, layer, mlp_input)
    if layer == n_layers:
        return model.ln_final, "ln_final.hook_scale"
    if model.cfg.norm_placement == "output":
        where = "MLP" if mlp_input else "attention"
        raise ValueError(f"norm_placement='output': block {layer}'s {where} reads the residual stream "
                         "itself (its ln1/ln2 normalise the sublayer outputs), so no norm applies at this "
                         "layer; use layer=None (ln_final) or apply_ln=False")
    if mlp_input:
        norm = model.blocks[layer].ln2  # parallel_ln2 blocks have no MLP-input stream (refused above)
        return norm, f"blocks.{layer}.ln2.hook_scale"
    name = f"blocks.{layer}.ln1.hook_scale"
    per_position = 3 if cache.has_batch_dim else 2  # [batch pos 1]
    if name in cache and cache[name].ndim > per_position:
        raise ValueError(f"{name} was cached per head ({tuple(cache[name].shape)}): under use_attn_in or "
                         "use_split_qkv_input ln1 normalises one input per head, so the stream entering block "
                         f"{layer} has no single ln1 to apply; cache with those flags off, or use the final norm "
                         "or mlp_input=True")
    return model.blocks[layer].ln1, name


def attn_only(model) -> bool:
    """Whether the model's blocks have no MLP."""
    return bool(getattr(model.cfg, "attn_only", False))


def stream_at(cache, layer: int, mlp_input: bool = False) -> Tensor:
    """The cached residual stream entering stream position ``layer`` (its MLP with ``mlp_input``)."""
    n_layers = cache.model.cfg.n_layers
    if layer == n_layers:
        return cache[("resid_post", n_layers - 1)]
    return cache[("resid_mid" if mlp_input else "resid_pre", layer)]


# -- stacks of residual-stream vectors ---------------------------------------------------------
def accumulated_resid(cache, layer=None, incl_mid: bool = False, apply_ln: bool = False,
                      pos_slice: PosSlice = None, mlp_input: bool = False, return_labels: bool = False):
    """The residual stream at each point up to ``layer``: [component *batch_and_pos d_model].

    Labels "0_pre", "0_mid" (with ``incl_mid``), "1_pre", ..., "final_post" (when ``layer`` is None or
    n_layers). ``apply_ln`` normalises each entry by its own statistics with the weights of the norm
    that reads the stream at ``layer`` (ln_final for the last layer): the logit lens. Unembedding the
    "final_post" entry gives the model's logits.
    """
    n_layers = cache.model.cfg.n_layers
    layer = stream_layer(cache.model.cfg, layer)
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
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, pos_slice=pos_slice, recompute_ln=True)
    return (stack, labels) if return_labels else stack


def decompose_resid(cache, layer=None, mlp_input: bool = False, mode: str = "all",
                    apply_ln: bool = False, pos_slice: PosSlice = None, incl_embeds: bool = True,
                    return_labels: bool = False, affine: bool = True):
    """The residual stream entering ``layer`` as a stack of the outputs that wrote it.

    Labels "embed", "pos_embed" (models with a position embedding), then "{l}_attn_out" and
    "{l}_mlp_out" for every earlier layer (and "{layer}_attn_out" with ``mlp_input``); an
    attention-only model has no "_mlp_out" rows. With mode "all" and the embeddings, the stack sums to
    the residual stream. ``apply_ln`` gives each component's linear share of the norm at ``layer``
    (``affine`` as in ``apply_ln_to_stack``); the norm's bias is not in any component.
    """
    if mode not in ("all", "attn", "mlp"):
        raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
    check_stream(cache, layer, mlp_input)  # validates layer and the architecture
    layer = stream_layer(cache.model.cfg, layer)
    with_mlp = mode != "attn" and not attn_only(cache.model)
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
        if with_mlp and l < layer:
            tensors.append(cache[("mlp_out", l)])
            labels.append(f"{l}_mlp_out")
    if not tensors:
        raise ValueError(f"nothing to decompose for layer={layer}, mode={mode!r}, incl_embeds={incl_embeds}")
    stack = torch.stack([slice_pos(cache, t, pos_slice) for t in tensors])
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input=mlp_input, pos_slice=pos_slice, affine=affine)
    return (stack, labels) if return_labels else stack


# -- per-head writes --------------------------------------------------------------------------
def head_results(cache, layer) -> Float[Tensor, "*batch pos head d_model"]:
    """Each head's z @ W_O at block ``layer``, from ``hook_z`` (``hook_result``'s meaning). Where a norm
    follows the attention (sandwich, output) this is before it; ``stack_head_results`` gives the share
    that reaches the residual stream."""
    model = cache.model
    z = cache[("z", layer)]
    W_O = model.blocks[layer].attn.W_O.detach().to(z.device, z.dtype)
    return einsum(z, W_O, "... head d_head, head d_head d_model -> ... head d_model")


def compute_head_results(cache) -> None:
    """Add ``blocks.{l}.attn.hook_result`` [*batch pos head d_model] to the cache for every layer that
    lacks it, from ``hook_z`` and W_O. An entry the run cached already is left as it is."""
    model = cache.model
    missing = [l for l in range(model.cfg.n_layers) if f"blocks.{l}.attn.hook_result" not in cache.cache_dict]
    computed = {f"blocks.{l}.attn.hook_result": head_results(cache, l) for l in missing}
    cache.cache_dict.update(computed)  # all or nothing: a missing hook_z raised above


def stack_head_results(cache, layer=-1, return_labels: bool = False, incl_remainder: bool = False,
                       pos_slice: PosSlice = None, apply_ln: bool = False, incl_b_O: bool = False,
                       affine: bool = True):
    """Each head's write to the residual stream, z @ W_O, for the blocks before ``layer``.

    [layer*head *batch_and_pos d_model], labels "L{l}H{h}". The output bias b_O belongs to no head:
    with ``incl_b_O`` it follows each layer's heads as its own row "L{l}_b_O", so a layer's rows sum
    to its hook_attn_out. Where a norm follows the attention (norm_placement "sandwich": ln1_post;
    "output": ln1) each row is its exact share of that norm's output at the cached scale
    (``sublayer_norm``), the norm's bias (LayerNorm) joining the "L{l}_b_O" row, so the rows still sum
    to hook_attn_out; the norm's hook_scale must then be in the cache. With ``incl_remainder`` a last row "remainder" holds the rest of the stream
    entering ``layer`` (the stream minus every other row), so the rows sum to that stream. ``layer=0``
    gives no head rows (an empty stack unless ``incl_remainder``). Computed from ``hook_z`` (never from
    a cached ``hook_result``), so it needs hook_z in the cache and holds with or without
    use_attn_result; a hook that edited ``hook_result`` in the run is not seen. ``apply_ln``: see
    ``apply_ln_to_stack`` (``affine`` too).
    """
    model = cache.model
    layer = stream_layer(model.cfg, layer)
    if incl_remainder or apply_ln:
        check_stream(cache, layer)  # a remainder or a norm needs a residual stream of summed outputs
    rows, labels = [], []
    for l in range(layer):
        writes = sublayer_norm.share(cache, l, "attn", head_results(cache, l))
        results = slice_pos(cache, writes, pos_slice, dim=-3)
        rows.append(results.movedim(-2, 0))
        labels += [f"L{l}H{h}" for h in range(model.cfg.n_heads)]
        if incl_b_O:
            b_O = sublayer_norm.bias_share(cache, l, "attn", model.blocks[l].attn.b_O, writes[..., 0, :])
            rows.append(slice_pos(cache, b_O, pos_slice)[None])
            labels.append(f"L{l}_b_O")
    if not rows:
        empty = slice_pos(cache, stream_at(cache, 0), pos_slice)
        rows.append(empty.new_zeros((0, *empty.shape)))
    stack = torch.cat(rows)
    if incl_remainder:
        stack, labels = with_remainder(cache, stack, labels, layer, pos_slice)
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, pos_slice=pos_slice, affine=affine)
    return (stack, labels) if return_labels else stack


def with_remainder(cache, stack: Tensor, labels: list, layer: int, pos_slice: PosSlice,
                   mlp_input: bool = False) -> tuple:
    """The stack with one more row, "remainder": the stream entering ``layer`` minus the stack's sum."""
    stream = slice_pos(cache, stream_at(cache, layer, mlp_input), pos_slice).to(stack.dtype)
    return torch.cat([stack, (stream - stack.sum(0))[None]]), [*labels, "remainder"]


# -- norms and attribution ---------------------------------------------------------------------
def apply_ln_to_stack(cache, residual_stack: Float[Tensor, "*stack d_model"], layer=None,
                      mlp_input: bool = False, pos_slice: PosSlice = None, batch_slice=None,
                      has_batch_dim: bool = True, recompute_ln: bool = False, incl_bias: bool = False,
                      affine: bool = True) -> Float[Tensor, "*stack_out d_model"]:
    """Apply the norm that reads the stream at ``layer`` (ln_final when None or -1) to a stack.

    Default: the stack is a decomposition, so each component is centred (LayerNorm; RMSNorm does not
    centre) and divided by the scale the forward pass used (cached; ``pos_slice`` and ``batch_slice``
    select its positions and sequences to match the stack), then multiplied by w. With ``incl_bias``
    the bias b follows as one more component, and the rows sum to the norm's output exactly. With
    ``recompute_ln`` each entry is a whole residual stream and is normalised by its own statistics, w
    and b included.

    ``affine=False`` leaves out w and b (``incl_bias`` is then refused): centring and the cached scale
    only, TransformerLens's contract, which is the norm's exact share only where w and b were folded
    into the weights that read it (``fold_ln``).

    ``batch_slice`` picks sequences of the stack (its axis 1, when ``has_batch_dim``) and of the cached
    scale (when the cache has a batch axis); ``has_batch_dim=False`` says the stack has no batch axis,
    so only the scale is cut (to the one sequence the stack belongs to).

    The stack's last axis must be d_model. A stack with no component axis (``[batch d_model]`` at
    ``pos_slice=-1``: one stream per position, its leading axes those of the cached scale) is treated as
    a stack of one component and comes back without that axis, ``incl_bias`` adding b in; anything
    else whose leading axes are not the scale's is refused, naming both.
    """
    if incl_bias and not affine:
        raise ValueError("incl_bias appends the norm's bias b, which affine=False leaves out")
    check_width(cache, residual_stack)
    norm, scale_name = norm_at(cache, layer, mlp_input)
    scale = None
    if not recompute_ln or (batch_slice is not None and scale_name in cache):  # recompute: the form cuts the batch
        scale = cached_scale(cache, scale_name, pos_slice, batch_slice)
    if scale is not None and not has_component_axis(residual_stack, scale, scale_name, batch_slice, has_batch_dim):
        # one stream per position ([batch d_model] with pos_slice=-1): a stack of one component
        one = apply_ln_to_stack(cache, residual_stack[None], layer, mlp_input, pos_slice, batch_slice,
                                has_batch_dim, recompute_ln, incl_bias, affine)
        return one.sum(0) if incl_bias else one[0]
    stack = residual_stack
    if has_batch_dim:
        stack = index_axis(stack, batch_slice, 1, "batch_slice")
    center = cache.model.cfg.normalization == "LN"
    w = sublayer_norm.norm_weight(norm, stack)  # (offset + w) under cfg.norm_weight_offset (Gemma)
    b = getattr(norm, "b", None)
    b = b.detach().to(stack.device, stack.dtype) if b is not None else torch.zeros_like(w)
    if not affine:
        w, b = torch.ones_like(w), torch.zeros_like(w)
    x = stack - stack.mean(-1, keepdim=True) if center else stack
    if recompute_ln:
        if incl_bias:
            raise ValueError("recompute_ln normalises whole streams; each already includes the bias")
        # the mean square in float32 for half-precision streams (above 65504 it is inf in float16)
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return x / (wide.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt().to(x.dtype) * w + b
    scale = scale.to(stack.device, stack.dtype)
    out = x / scale * w if affine else x / scale
    if incl_bias:
        out = torch.cat([out, b.expand(1, *out.shape[1:])])
    return out


def check_width(cache, residual_stack: Tensor) -> None:
    """A stack of residual-stream vectors ends in d_model; else a ValueError naming both widths."""
    cfg = cache.model.cfg
    if not isinstance(residual_stack, Tensor):
        raise TypeError(f"residual_stack must be a tensor [component *batch_and_pos d_model], got "
                        f"{type(residual_stack).__name__}")
    if residual_stack.ndim == 0:
        raise ValueError(f"residual_stack must end in the residual stream's axis (d_model={cfg.d_model}), got a 0-d "
                         "tensor")
    width = residual_stack.shape[-1]
    if width != cfg.d_model:
        d_mlp = getattr(cfg, "d_mlp", None)
        hint = (" (d_mlp: neuron activations, not their writes to the residual stream; get_neuron_results or "
                "stack_neuron_results give those)") if width == d_mlp else ""
        raise ValueError(f"residual_stack {tuple(residual_stack.shape)} is {width} wide, but the residual stream "
                         f"is d_model={cfg.d_model} wide{hint}")


def cached_scale(cache, scale_name: str, pos_slice: PosSlice, batch_slice) -> Tensor:
    """The cached scale [*batch_and_pos 1] at the positions and sequences a stack was cut to."""
    scale = slice_pos(cache, cache[scale_name], pos_slice)
    return index_axis(scale, batch_slice, 0, "batch_slice") if cache.has_batch_dim else scale


def has_component_axis(stack: Tensor, scale: Tensor, scale_name: str, batch_slice, has_batch_dim: bool) -> bool:
    """Whether ``stack`` is [component *lead d_model] (True) or [*lead d_model] (False), where ``lead`` is
    the batch/pos axes of the cached ``scale`` [*lead 1] (already cut by pos_slice and batch_slice)."""
    cut = has_batch_dim and (isinstance(batch_slice, Integral) or (isinstance(batch_slice, Tensor)
                                                                    and batch_slice.ndim == 0))
    lead, ndim = tuple(scale.shape[:-1]), stack.ndim - (1 if cut else 0)
    if ndim == len(lead) + 2:
        cut_stack = index_axis(stack, batch_slice, 1, "batch_slice") if has_batch_dim else stack
        if tuple(cut_stack.shape[1:-1]) == lead:
            return True
        got = tuple(cut_stack.shape[1:-1])
    elif ndim == len(lead) + 1 and ndim >= 1:
        cut_stack = index_axis(stack, batch_slice, 0, "batch_slice") if has_batch_dim else stack
        if tuple(cut_stack.shape[:-1]) == lead:
            return False
        got = tuple(cut_stack.shape[:-1])
    else:
        got = tuple(stack.shape)
    axes = "".join(f"{n} " for n in lead)
    raise ValueError(f"residual_stack {tuple(stack.shape)}: its batch/pos axes {got} do not match the cached scale "
                     f"{lead} of {scale_name}, as [component {axes}d_model] or [{axes}d_model]; pass the pos_slice "
                     "(and batch_slice, has_batch_dim) the stack was cut with")


def logit_attrs(cache, residual_stack: Float[Tensor, "*stack d_model"], tokens, incorrect_tokens=None,
                pos_slice: PosSlice = None, batch_slice=None, has_batch_dim: bool = True,
                incl_bias: bool = True, affine: bool = True,
                pre_cap: bool = False) -> Float[Tensor, "*attrs"]:
    """Direct logit attribution: each component's share of the logit of ``tokens``.

    A model with ``cfg.output_logits_soft_cap`` (Gemma 2) computes its logits as cap * tanh(x / cap)
    of x = the unembedding's output, which is not linear, so no component has an exact share of them:
    refused unless ``pre_cap=True``, which attributes x itself (``unembed.hook_pre_cap``); the rows
    then sum to that, not to the logits.

    The stack is in residual-stream space (not normalised). Each component passes through the final
    norm exactly (see ``apply_ln_to_stack``, which takes ``pos_slice``, ``batch_slice``,
    ``has_batch_dim`` and ``affine``) and is dotted with the token's unembedding direction. With
    ``incl_bias`` (default) one more row is appended: the norm's bias (plus any unembedding bias), so
    the rows sum to the model's logit, or logit difference with ``incorrect_tokens``.

    ``tokens``: a str or int (one token everywhere), or a tensor whose shape is a prefix of the
    stack's batch/pos axes (e.g. [batch] for a stack at one position, [batch pos] for all). Ids must
    lie in [0, d_vocab): a negative id is refused, not read from the end of the vocabulary. A stack with no
    component axis (one stream per position) gives its attribution without that axis, the bias row
    added in with ``incl_bias``.
    """
    # a TransformerLens-style config reads -1.0 for "no cap" under this name: ask the glassbox Config
    cap = getattr(getattr(cache.model.cfg, "glassbox", cache.model.cfg), "output_logits_soft_cap", None)
    if cap is not None and not pre_cap:
        raise ValueError(f"the model soft-caps its logits (output_logits_soft_cap={cap}): cap * tanh(x / cap) is "
                         "not linear, so components have no exact share of the logits; pass pre_cap=True to "
                         "attribute the uncapped logits (unembed.hook_pre_cap), which the rows then sum to")
    check_width(cache, residual_stack)
    scale_name = norm_at(cache, None)[1]
    scale = cached_scale(cache, scale_name, pos_slice, batch_slice)
    if not has_component_axis(residual_stack, scale, scale_name, batch_slice, has_batch_dim):
        # one stream per position: its attribution, the bias row added in with incl_bias
        one = logit_attrs(cache, residual_stack[None], tokens, incorrect_tokens, pos_slice, batch_slice,
                          has_batch_dim, incl_bias, affine, pre_cap)
        return one.sum(0) if incl_bias else one[0]
    scaled = apply_ln_to_stack(cache, residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice,
                               has_batch_dim=has_batch_dim, incl_bias=incl_bias, affine=affine)
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
