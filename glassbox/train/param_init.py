"""Xavier and Kaiming initialisation with the fans of glassbox's (TransformerLens's) weight layout.

torch's ``nn.init`` reads a 2-D weight as [out in]; glassbox's right-multiplying weights are [in out]
(``W_in [d_model d_mlp]``) and per-head ones [head d_model d_head]. ``fans`` gives (fan_in, fan_out):
a vector [n] is (1, n); a matrix [a b] is (a, b); a per-head weight [h a b] is (a, h * b), all heads
together. Footgun: ``W_O [head d_head d_model]`` then reads as fan_in d_head, fan_out head * d_model,
as in TransformerLens.

Xavier: uniform on +-gain * sqrt(6 / (fan_in + fan_out)), or normal with std gain * sqrt(2 / (fan_in +
fan_out)). Kaiming: ``gain`` times ``nn.init.calculate_gain(nonlinearity, a)``, over the fan of
``mode``: uniform on +-gain * sqrt(3 / fan), or normal with std gain / sqrt(fan). Each fills the
tensor in place (with ``generator`` when given) and returns it.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn


def fans(tensor: Tensor) -> Tuple[int, int]:
    """(fan_in, fan_out) in glassbox's layout; see the module docstring."""
    shape = tuple(tensor.shape)
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    if len(shape) == 3:
        return shape[1], shape[0] * shape[2]
    raise ValueError(f"fans are defined for 1-, 2- and 3-d weights, got shape {shape}")


def _fill_uniform(tensor: Tensor, bound: float, generator) -> Tensor:
    with torch.no_grad():
        return tensor.uniform_(-bound, bound, generator=generator)


def _fill_normal(tensor: Tensor, std: float, generator) -> Tensor:
    with torch.no_grad():
        return tensor.normal_(0.0, std, generator=generator)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Optional[torch.Generator] = None) -> Tensor:
    fan_in, fan_out = fans(tensor)
    return _fill_uniform(tensor, gain * math.sqrt(6.0 / (fan_in + fan_out)), generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Optional[torch.Generator] = None) -> Tensor:
    fan_in, fan_out = fans(tensor)
    return _fill_normal(tensor, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_scale(tensor: Tensor, a: float, nonlinearity: str, gain: float, mode: str) -> Tuple[int, float]:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fans(tensor)
    return (fan_in if mode == "fan_in" else fan_out), gain * nn.init.calculate_gain(nonlinearity, a)


def kaiming_uniform_(tensor: Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0,
                     mode: str = "fan_in", generator: Optional[torch.Generator] = None) -> Tensor:
    fan, scale = _kaiming_scale(tensor, a, nonlinearity, gain, mode)
    return _fill_uniform(tensor, scale * math.sqrt(3.0 / fan), generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0,
                    mode: str = "fan_in", generator: Optional[torch.Generator] = None) -> Tensor:
    fan, scale = _kaiming_scale(tensor, a, nonlinearity, gain, mode)
    return _fill_normal(tensor, scale / math.sqrt(fan), generator)
