"""xIELU (https://arxiv.org/abs/2411.13010): a piecewise activation with two learned slopes.

    f(x) = alpha_p x^2 + beta x                          for x > 0
    f(x) = alpha_n (expm1(min(x, eps)) - x) + beta x     for x <= 0

``xielu(x)`` is the function at fixed values (alpha_p = alpha_n = 0.8, beta = 0.5, eps = -1e-6, the
paper's initialisation). ``XIELU`` is the trainable module, parameterised as ``transformers``'
``XIELUActivation``: ``alpha_p`` and ``alpha_n`` are stored before a softplus (alpha_p =
softplus(alpha_p_raw), alpha_n = beta + softplus(alpha_n_raw), so alpha_n >= beta always; an initial
alpha_n equal to beta is stored as -inf, as in transformers), ``beta`` and
``eps`` are buffers. Differences from transformers' module: the parameters are 0-dim (transformers':
shape [1]) and float32 by default (transformers': bfloat16), and there is no fused CUDA kernel.

Footguns: not in ``ACTIVATIONS`` (an MLP weight file would have to hold its two parameters, so the
converters refuse "xielu" by name); ``eps`` must be <= 0 (it caps the negative branch's exponent).
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def xielu(x: Tensor, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5, eps: float = -1e-6) -> Tensor:
    """xIELU at fixed effective values (see the module docstring); any shape, any float dtype and device."""
    negative = (torch.expm1(x.clamp(max=eps)) - x) * alpha_n + beta * x
    return torch.where(x > 0, alpha_p * x * x + beta * x, negative)


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"XIELU: {name} must be a finite number, got {value!r}")
    return float(value)


class XIELU(nn.Module):
    """Trainable xIELU: ``alpha_p``, ``alpha_n`` parameters (softplus-inverse space), ``beta``, ``eps`` buffers."""

    def __init__(self, alpha_p_init=0.8, alpha_n_init=0.8, beta_init=0.5, eps=-1e-6,
                 dtype: torch.dtype = torch.float32):  # the numbers are checked here, not annotated
        super().__init__()
        alpha_p_init, alpha_n_init = _number("alpha_p_init", alpha_p_init), _number("alpha_n_init", alpha_n_init)
        beta_init, eps = _number("beta_init", beta_init), _number("eps", eps)
        # softplus reaches [0, inf) (0 as the stored value -inf): below it the inverse is nan, and so the output
        if alpha_p_init < 0:
            raise ValueError(f"XIELU: alpha_p_init must be >= 0 (alpha_p = softplus(.) >= 0), got {alpha_p_init}")
        if alpha_n_init < beta_init:
            raise ValueError(f"XIELU: alpha_n_init must be >= beta_init (alpha_n = beta + softplus(.)), got "
                             f"alpha_n_init={alpha_n_init}, beta_init={beta_init}")
        if eps > 0:
            raise ValueError(f"XIELU: eps must be <= 0 (it caps the negative branch), got {eps}")
        self.alpha_p = nn.Parameter(_softplus_inverse(alpha_p_init, dtype))
        self.alpha_n = nn.Parameter(_softplus_inverse(alpha_n_init - beta_init, dtype))
        self.register_buffer("beta", torch.tensor(beta_init, dtype=dtype))
        self.register_buffer("eps", torch.tensor(eps, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        negative = (torch.expm1(torch.minimum(x, self.eps)) - x) * alpha_n + self.beta * x
        return torch.where(x > 0, alpha_p * x * x + self.beta * x, negative)


def _softplus_inverse(y: float, dtype: torch.dtype) -> Tensor:
    """log(exp(y) - 1), computed in float64 and rounded once to ``dtype``."""
    return torch.log(torch.expm1(torch.tensor(y, dtype=torch.float64))).to(dtype)
