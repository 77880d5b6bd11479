"""Small tensor operations shared by the components."""

import torch
from torch import Tensor


def linear(x: Tensor, W: Tensor, b) -> Tensor:
    """x @ W (+ b) for W [d_in d_out], over any leading axes, as one GEMM reading W in place."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.addmm(b, flat, W) if b is not None else flat @ W
    return out.view(*x.shape[:-1], W.shape[-1])


def per_head_linear(x: Tensor, W: Tensor, b) -> Tensor:
    """x [batch pos head d_model] @ W [head d_model d_head] (+ b [head d_head]), each head its own input."""
    out = torch.einsum("bphd,hde->bphe", x, W)
    return out + b if b is not None else out
