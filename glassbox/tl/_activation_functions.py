"""TransformerLens's ``utilities.activation_functions``: its activations by name, on glassbox's functions.

``ACTIVATION_FN_DICT`` (``SUPPORTED_ACTIVATIONS`` in 3.x) maps TransformerLens's ``act_fn`` names to
callables: glassbox's ``glassbox.models.activations`` and ``glassbox.models.xielu``. "solu_ln" is
``solu`` (the LayerNorm after it belongs to the MLP). ``XIELU`` and ``xielu`` are glassbox's xIELU
module and fixed-value function. ``apply_softcap(x, cap)`` is cap * tanh(x / cap), the identity for a
cap of None or <= 0 (TransformerLens's -1.0 is "off").
"""

from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.activations import gelu_fast, gelu_new, relu2, solu
from ..models.xielu import XIELU, xielu

SOFTCAP_DISABLED = -1.0


def softcap_enabled(cap: Optional[float]) -> bool:
    """A cap is on only when it is a number > 0 (None, 0 and TransformerLens's -1.0 are off)."""
    return cap is not None and cap > 0


def apply_softcap(x: Tensor, cap: Optional[float]) -> Tensor:
    if not softcap_enabled(cap):
        return x
    return cap * torch.tanh(x / cap)


ActivationFunction = Callable[..., Tensor]
# "gelu_new" and "gelu_pytorch_tanh" are glassbox's one tanh approximation (the fused kernel, what its MLPs
# compute); TransformerLens writes gelu_new's formula out, which agrees to float rounding.
ACTIVATION_FN_DICT: Dict[str, ActivationFunction] = {
    "solu": solu, "solu_ln": solu, "gelu_new": gelu_new, "gelu_fast": gelu_fast, "silu": F.silu,
    "relu": F.relu, "gelu": F.gelu, "gelu_pytorch_tanh": gelu_new, "xielu": xielu, "relu2": relu2,
}
SUPPORTED_ACTIVATIONS = ACTIVATION_FN_DICT

__all__ = ["ACTIVATION_FN_DICT", "ActivationFunction", "SOFTCAP_DISABLED", "SUPPORTED_ACTIVATIONS", "XIELU",
           "apply_softcap", "gelu_fast", "gelu_new", "relu2", "softcap_enabled", "solu", "xielu"]
