"""Small tensor operations shared by the components."""

import torch
from torch import Tensor


def linear(x: Tensor, W: Tensor, b) -> Tensor:
    """x @ W (+ b) for W [d_in d_out], over any leading axes, as one GEMM reading W in place."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.addmm(b, flat, W) if b is not None else flat @ W
    return out.view(*x.shape[:-1], W.shape[-1])
