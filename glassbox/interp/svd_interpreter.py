"""Singular directions of a head's OV circuit or an MLP's weights, read in the vocabulary.

``singular_vocab_directions(model, kind, layer, head=None, k=10)`` takes the top ``k`` right
singular vectors of one weight matrix, each a direction in the residual stream that the matrix
writes to (OV, ``w_out``) or reads from (``w_in``), and maps each onto the vocabulary through the
unembedding ``W_U`` (no final norm): [d_vocab k], column i for the i-th largest singular value.

| kind | matrix [rows d_model] | right singular vectors live in |
| --- | --- | --- |
| "OV" | head's OV circuit W_V[head] @ W_O[head] [d_model d_model] (a FactoredMatrix, never formed) | output space |
| "w_in" | W_in^T [d_mlp d_model], times the weight of the norm the MLP reads, per column | MLP input space |
| "w_out" | W_out [d_mlp d_model] | MLP output space |

This is the method of Millidge & Black's SVD post and of TransformerLens's ``SVDInterpreter``, with
the same matrices (ln2's weight folded into W_in as TransformerLens does when its model keeps it;
glassbox models keep it unless processed). The norm folded is the one the MLP reads: ln2 in a
pre-norm or sandwich block and in a GPT-NeoX parallel block, ln1 in a GPT-J parallel block, none in a
post-norm or output-norm block (ln2 follows the MLP); Gemma's weight offset is included. With
grouped-query attention a head's OV circuit uses its key/value head's W_V.

Footguns: a singular vector is defined only up to its sign (and, for repeated singular values, up
to a rotation), so compare columns up to sign; it differs between devices and SVD algorithms.
``k`` may not exceed the number of singular vectors: d_head for OV, d_model for w_in/w_out (their
SVD is the full one, as TransformerLens's, so for d_mlp < d_model the last d_model - d_mlp
directions are an arbitrary orthonormal completion, not singular directions of the matrix).
"""

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor

from .factored_matrix import FactoredMatrix

KINDS = ("OV", "w_in", "w_out")


def _check_index(value, size: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{what} must be an int in [0, {size - 1}], got {value!r}")
    return value


def singular_directions(model, kind: str, layer: int, head: Optional[int] = None) -> Float[Tensor, "n d_model"]:
    """Right singular vectors of the matrix ``kind`` (see the module table) as rows, largest first."""
    cfg = model.cfg
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    layer = _check_index(layer, cfg.n_layers, "layer")
    block = model.blocks[layer]
    if kind == "OV":
        if head is None:
            raise ValueError("the OV kind needs a head; w_in and w_out are per layer")
        head = _check_index(head, cfg.n_heads, "head")
        kv_head = head // cfg.n_kv_groups  # grouped-query attention: the query head's key/value head
        return FactoredMatrix(block.attn.W_V[kv_head], block.attn.W_O[head]).V.transpose(-2, -1)
    if head is not None:
        raise ValueError(f"head={head!r} given for {kind!r}, which is a whole layer's MLP matrix")
    mlp = getattr(block, "mlp", None)
    if mlp is None or not hasattr(mlp, "W_in"):
        raise ValueError(f"block {layer} has no MLP with W_in/W_out (an attention-only model?)")
    if kind == "w_in":
        matrix = mlp.W_in.transpose(-2, -1)  # [d_mlp d_model]
        norm_w = _mlp_norm_weight(model, block)
        if norm_w is not None:  # the MLP reads x_normalised * w (+ b): fold w into the columns
            matrix = matrix * norm_w
    else:
        matrix = mlp.W_out
    full = matrix.float() if matrix.dtype in (torch.float16, torch.bfloat16) else matrix
    return torch.linalg.svd(full)[2]


def _mlp_norm_weight(model, block) -> Optional[Tensor]:
    """The weight of the norm right before the MLP: ln2 in a pre-norm or sandwich block and in a
    GPT-NeoX parallel block (parallel_ln2), ln1 in a GPT-J parallel one (its MLP reads ln1's output),
    none in a post-norm or output-norm block (there ln2 follows the MLP). With cfg.norm_weight_offset
    (Gemma) the weight is (offset + w)."""
    cfg = model.cfg
    if cfg.norm_placement not in ("pre", "sandwich"):
        return None
    norm = getattr(block, "ln1" if cfg.parallel_attn_mlp and not cfg.parallel_ln2 else "ln2", None)
    if getattr(norm, "w", None) is None:
        return None
    return norm.w + float(getattr(norm, "offset", 0.0))


def singular_vocab_directions(model, kind: str, layer: int, head: Optional[int] = None,
                              k: int = 10) -> Float[Tensor, "d_vocab k"]:
    """The top ``k`` singular directions of ``kind`` mapped through W_U: [d_vocab k], in float32 or wider."""
    with torch.no_grad():
        directions = singular_directions(model, kind, layer, head)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= directions.shape[0]:
            raise ValueError(f"k must be an int in [1, {directions.shape[0]}] for {kind!r} (the number of "
                             f"singular vectors), got {k!r}")
        top = directions[:k]
        if top.dtype not in (torch.float32, torch.float64):
            top = top.float()
        W_U = model.W_U
        return (top @ W_U.to(top.dtype)).transpose(0, 1)
