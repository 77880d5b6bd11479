"""The MLP activation functions, by the names ``transformers`` gives them (``activation_function`` /
``hidden_act`` in a config), so a config's name maps onto glassbox unchanged.

Each is written here from its formula; tests/test_gpt2_variants.py checks every one against
``transformers.activations.ACT2FN`` and against a GPT-2 of that activation. Two names transformers
accepts are not here, because they carry learned parameters an MLP weight file would have to hold:
"prelu" and "xielu"; converters refuse them by name.

"gelu_new", "gelu_pytorch_tanh", "gelu_python_tanh" and "gelu_accurate" are one function (the tanh
approximation), "gelu_fast" the same approximation in its factored form; "gelu" and "gelu_python"
the exact erf form; "swish" is "silu".

``OWN_ACTIVATIONS`` holds the activations transformers has no name for: "solu", x * softmax(x) over
d_mlp (Anthropic's SoLU, as TransformerLens's models compute it; the LayerNorm those models put after
it is ``Config.mlp_ln``, not part of the activation). ``ALL_ACTIVATIONS`` is both tables: what
``Config.act_fn`` accepts.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


def gelu_fast(x: Tensor) -> Tensor:
    """0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2))), the tanh approximation factored."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_accurate(x: Tensor) -> Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) computed from the formula, not the fused kernel."""
    return 0.5 * x * (1 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3))))


def quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


def gelu_10(x: Tensor) -> Tensor:
    """Exact GELU clipped to [-10, 10]."""
    return torch.clip(F.gelu(x), -10.0, 10.0)


def laplace(x: Tensor, mu: float = 0.707107, sigma: float = 0.282095) -> Tensor:
    """The CDF of a normal of mean mu and deviation sigma: 0.5 (1 + erf((x - mu) / (sigma sqrt 2)))."""
    return 0.5 * (1.0 + torch.erf((x - mu) / (sigma * math.sqrt(2.0))))


def relu2(x: Tensor) -> Tensor:
    return torch.square(F.relu(x))


def mish(x: Tensor) -> Tensor:
    return x * torch.tanh(F.softplus(x))


def sqrtsoftplus(x: Tensor) -> Tensor:
    return F.softplus(x).sqrt()


def linear(x: Tensor) -> Tensor:
    return x


def solu(x: Tensor) -> Tensor:
    """x * softmax(x) over the last axis (d_mlp): SoLU, without the LayerNorm that follows it."""
    return x * torch.softmax(x, dim=-1)


ACTIVATIONS = {
    "gelu_new": gelu_new, "gelu": F.gelu, "relu": F.relu, "silu": F.silu,
    "gelu_pytorch_tanh": gelu_new, "gelu_python_tanh": gelu_accurate, "gelu_accurate": gelu_accurate,
    "gelu_fast": gelu_fast, "gelu_python": F.gelu, "gelu_10": gelu_10, "quick_gelu": quick_gelu,
    "swish": F.silu, "mish": mish, "relu2": relu2, "relu6": F.relu6, "leaky_relu": F.leaky_relu,
    "hardswish": F.hardswish, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "laplace": laplace,
    "sqrtsoftplus": sqrtsoftplus, "linear": linear,
}
# Accepted by transformers, refused here: their learned parameters are not MLP weights glassbox holds.
PARAMETRISED_ACTIVATIONS = ("prelu", "xielu")

# Not transformers' names: activations of models glassbox loads in other formats.
OWN_ACTIVATIONS = {"solu": solu}
ALL_ACTIVATIONS = {**ACTIVATIONS, **OWN_ACTIVATIONS}


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """Gemma's soft cap, ``cap * tanh(x / cap)`` (the attention scores' and the logits'; cap > 0)."""
    return cap * torch.tanh(x / cap)
