"""``transformer_lens.utilities.activation_functions``: ``gelu_new`` and the soft-cap helpers of 3.x.

A cap is on only when it is a number > 0; ``SOFTCAP_DISABLED`` (-1.0), 0 and None mean off, and then
``apply_softcap`` returns its input itself. The cap is glassbox's ``models.activations.soft_cap``.
TransformerLens's other names here (``SUPPORTED_ACTIVATIONS``, ``solu``, ``XIELU``) are not given.
"""

from typing import Optional

from torch import Tensor

from ...models.activations import soft_cap
from ...models.mlp import gelu_new

SOFTCAP_DISABLED: float = -1.0


def softcap_enabled(cap: Optional[float]) -> bool:
    """Whether ``cap`` turns a soft cap on: a number > 0."""
    return cap is not None and cap > 0


def apply_softcap(x: Tensor, cap: Optional[float]) -> Tensor:
    """``cap * tanh(x / cap)`` when ``cap`` is on, else ``x`` unchanged."""
    return soft_cap(x, cap) if softcap_enabled(cap) else x


__all__ = ["SOFTCAP_DISABLED", "apply_softcap", "gelu_new", "softcap_enabled"]
