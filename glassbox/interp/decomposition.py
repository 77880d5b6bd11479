"""The full residual decomposition: the stream entering a layer as every head's write, every neuron's
write (or each MLP's output), the embeddings and one row of accumulated biases.

Rows, in TransformerLens's order and labels: "L{l}H{h}" for each head of the blocks before ``layer``
(and of ``layer`` itself with ``mlp_input``), then "L{l}N{n}" for each neuron (``expand_neurons``) or
"{l}_mlp_out" for each MLP of the blocks before ``layer`` (none in an attention-only model), then
"embed", "pos_embed" (models with a position embedding) and "bias": the sum of the b_O (and, with
``expand_neurons``, the b_out) that the head and neuron rows leave out. The rows sum to the stream
exactly (up to float rounding); with ``apply_ln`` they are each one's linear share of the norm at
``layer`` (see ``resid.apply_ln_to_stack``), whose bias b is in no row.

Sandwich and output-norm models (Gemma 2/3, OLMo 2): every head and neuron row is its exact share of
the norm after its sublayer (``sublayer_norm``), and "bias" holds the biases' shares plus those norms'
own biases, position by position; ``accumulated_bias`` (a fixed vector) is refused for them.
"""

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from . import sublayer_norm
from .neurons import _directions, stack_neuron_results
from .resid import apply_ln_to_stack, attn_only, check_stream, decompose_resid, stack_head_results, stream_at
from .slices import PosSlice, slice_pos, stream_layer


def accumulated_bias(model, layer, mlp_input: bool = False,
                     include_mlp_biases: bool = True) -> Float[Tensor, "d_model"]:
    """The sum of the output biases written before stream position ``layer``: every b_O (and b_out with
    ``include_mlp_biases``) of the blocks before it, and ``layer``'s own b_O with ``mlp_input``."""
    n_layers = model.cfg.n_layers
    layer = stream_layer(model.cfg, layer)
    if mlp_input and layer == n_layers:
        raise ValueError(f"mlp_input=True needs a block's MLP; layer={layer} is the unembedding's input")
    if sublayer_norm.sublayer_norm(model, 0, "attn") is not None:
        raise ValueError(f"norm_placement={model.cfg.norm_placement!r}: each block's output biases pass through "
                         "a norm at a per-position scale before they reach the residual stream, so their sum is "
                         "no fixed vector; get_full_resid_decomposition's 'bias' row gives their exact share")
    W_E = model.W_E
    total = torch.zeros(model.cfg.d_model, device=W_E.device, dtype=W_E.dtype)
    for l in range(layer + (1 if mlp_input else 0)):
        block = model.blocks[l]
        parts = [block.attn.b_O]
        if include_mlp_biases and l < layer and not attn_only(model):
            parts.append(block.mlp.b_out)
        for bias in parts:
            if bias is not None:
                total = total + bias.detach()
    return total


def get_full_resid_decomposition(cache, layer=None, mlp_input: bool = False, expand_neurons: bool = True,
                                 apply_ln: bool = False, pos_slice: PosSlice = None, return_labels: bool = False,
                                 project_output_onto: Optional[Tensor] = None, affine: bool = True):
    """The stream entering ``layer`` (None or -1: the unembedding's input; ``mlp_input``: the MLP's) as
    [component *batch_and_pos d_model] (the module docstring gives the rows). ``project_output_onto``
    ([d_model] or [d_model n]) replaces d_model by the projection, folded into the neuron rows before
    they are expanded; with ``apply_ln`` the norm is applied before projecting (``affine`` as in
    ``apply_ln_to_stack``)."""
    model = cache.model
    layer = stream_layer(model.cfg, layer)
    check_stream(cache, layer, mlp_input)
    if mlp_input and layer == model.cfg.n_layers:
        raise ValueError(f"mlp_input=True needs a block's MLP; layer={layer} is the unembedding's input")
    reference = slice_pos(cache, stream_at(cache, layer, mlp_input), pos_slice)
    p = None if project_output_onto is None else _directions(project_output_onto, model.cfg.d_model, reference)
    p2 = None if p is None else (p[:, None] if p.ndim == 1 else p)

    def finish(stack: Tensor) -> Tensor:  # d_model rows: the norm (when asked) then the projection
        if apply_ln:
            stack = apply_ln_to_stack(cache, stack, layer, mlp_input, pos_slice, affine=affine)
        return stack if p2 is None else stack @ p2

    heads, labels = stack_head_results(cache, layer + (1 if mlp_input else 0), return_labels=True,
                                       pos_slice=pos_slice)
    parts = [finish(heads)]
    if not attn_only(model) and layer > 0:
        if expand_neurons:  # the norm is folded into the neurons' projection where there is one
            neurons, more = stack_neuron_results(cache, layer, pos_slice, return_labels=True, apply_ln=apply_ln,
                                                 project_output_onto=p2, affine=affine, mlp_input=mlp_input)
        else:
            neurons, more = decompose_resid(cache, layer, mlp_input, mode="mlp", pos_slice=pos_slice,
                                            incl_embeds=False, return_labels=True)
            neurons = finish(neurons)
        parts.append(neurons)
        labels += more
    for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
        if name in model.hook_dict:
            parts.append(finish(slice_pos(cache, cache[name], pos_slice)[None]))
            labels.append(label)
    if sublayer_norm.sublayer_norm(model, 0, "attn") is None:
        bias = accumulated_bias(model, layer, mlp_input, include_mlp_biases=expand_neurons)
        bias = bias.to(reference.device, reference.dtype).expand(1, *reference.shape)
    else:  # sandwich / output norms: each bias's share at its position's scale (sublayer_norm)
        bias = _normed_biases(cache, layer, mlp_input, expand_neurons, stream_at(cache, layer, mlp_input))
        bias = slice_pos(cache, bias, pos_slice)[None]
    parts.append(finish(bias))
    labels.append("bias")
    stack = torch.cat(parts)
    if p is not None and p.ndim == 1:
        stack = stack[..., 0]
    return (stack, labels) if return_labels else stack


def _normed_biases(cache, layer: int, mlp_input: bool, include_mlp_biases: bool, like: Tensor) -> Tensor:
    """[*batch pos d_model]: the shares of the b_O (and b_out) the head and neuron rows leave out, each
    through the norm after its sublayer, plus those norms' own biases (and, without
    ``include_mlp_biases``, nothing of the MLPs: their "_mlp_out" rows hold all of it)."""
    model = cache.model
    total = torch.zeros_like(like)
    for l in range(layer + (1 if mlp_input else 0)):
        block = model.blocks[l]
        total = total + sublayer_norm.bias_share(cache, l, "attn", block.attn.b_O, like)
        if include_mlp_biases and l < layer and not attn_only(model):
            total = total + sublayer_norm.bias_share(cache, l, "mlp", block.mlp.b_out, like)
    return total
