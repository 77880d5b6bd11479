"""TransformerLens's ``utilities.attention``: the per-head projections, on glassbox's ``models.ops``.

``simple_attn_linear(input [batch pos d_model], w [head d_model d_head], b [head d_head])`` and
``complex_attn_linear(input [batch pos head d_model], w, b)`` (one input per head) both give
[batch pos head d_head] = input @ w[h] + b[h] per head.
"""

from torch import Tensor

from ..models.ops import linear, per_head_linear


def _check(name: str, input: Tensor, w: Tensor, b: Tensor, ndim: int) -> None:
    if not all(isinstance(t, Tensor) for t in (input, w, b)):
        raise TypeError(f"{name}: input, w and b must be tensors")
    heads, d_model, d_head = w.shape if w.ndim == 3 else (None, None, None)
    if input.ndim != ndim or w.ndim != 3 or tuple(b.shape) != (heads, d_head) or input.shape[-1] != d_model \
            or (ndim == 4 and input.shape[2] != heads):
        axes = "batch pos d_model" if ndim == 3 else "batch pos head d_model"
        raise ValueError(f"{name}: input [{axes}], w [head d_model d_head] and b [head d_head] do not fit: "
                         f"{tuple(input.shape)}, {tuple(w.shape)}, {tuple(b.shape)}")


def simple_attn_linear(input: Tensor, w: Tensor, b: Tensor) -> Tensor:
    _check("simple_attn_linear", input, w, b, 3)
    heads, d_model, d_head = w.shape
    flat = w.to(input.device).permute(1, 0, 2).reshape(d_model, heads * d_head)
    return linear(input, flat, b.to(input.device).reshape(-1)).view(*input.shape[:2], heads, d_head)


def complex_attn_linear(input: Tensor, w: Tensor, b: Tensor) -> Tensor:
    _check("complex_attn_linear", input, w, b, 4)
    return per_head_linear(input, w.to(input.device), b.to(input.device))


__all__ = ["complex_attn_linear", "simple_attn_linear"]
