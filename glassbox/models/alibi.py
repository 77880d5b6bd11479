"""ALiBi (https://arxiv.org/abs/2108.12409): attention biases linear in the query-key distance.

``alibi_bias(n_heads, n_ctx)[h, q, k] = m_h * min(k - q, 0)``: 0 on and above the diagonal, -m_h times
the distance below it, added to the attention scores before the softmax. ``alibi_slope(n_ctx)`` is the
distance matrix min(k - q, 0) [query_pos key_pos] and ``alibi_multipliers(n_heads)`` the per-head m_h.

The multipliers are the geometric sequence m_h = r^(h+1) with r = 2^(-8 / n_heads), TransformerLens's
formula. For a power-of-two head count it is the paper's and BLOOM's (``transformers``'
``build_alibi_tensor``); for other counts BLOOM interleaves a second sequence and the two differ
(tests/test_alibi.py checks both cases).

These are the tables only: no glassbox model uses ALiBi positions (a Config cannot ask for them);
glassbox.tl exposes them as TransformerLens's ``AbstractAttention.create_alibi_*``.
"""

from typing import Optional

import torch
from jaxtyping import Float
from torch import Tensor


def _count(name: str, value) -> int:  # sizes are checked here, not annotated (the test suite's checker)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def alibi_slope(n_ctx, device: Optional[torch.device] = None) -> Float[Tensor, "query_pos key_pos"]:
    """min(k - q, 0) for q, k in [0, n_ctx): float32 [n_ctx n_ctx], zero on and above the diagonal."""
    positions = torch.arange(_count("n_ctx", n_ctx), device=device)
    return (positions[None, :] - positions[:, None]).clamp(max=0).to(torch.float32)


def alibi_multipliers(n_heads, device: Optional[torch.device] = None) -> Float[Tensor, "head"]:
    """m_h = r^(h+1), r = 2^(-8 / n_heads): float32 [n_heads] (computed in float64, rounded once)."""
    exponents = torch.arange(1, _count("n_heads", n_heads) + 1, dtype=torch.float64, device=device)
    return torch.exp2(-8.0 / n_heads * exponents).to(torch.float32)


def alibi_bias(n_heads, n_ctx, device: Optional[torch.device] = None) -> Float[Tensor, "head query_pos key_pos"]:
    """m_h * min(k - q, 0): float32 [n_heads n_ctx n_ctx], to add to the scores before the softmax."""
    return alibi_multipliers(n_heads, device)[:, None, None] * alibi_slope(n_ctx, device)
