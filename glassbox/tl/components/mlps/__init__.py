"""TransformerLens's ``components.mlps``."""

from ....models import GatedMLP, MLP
from .can_be_used_as_mlp import CanBeUsedAsMLP

__all__ = ["CanBeUsedAsMLP", "GatedMLP", "MLP"]
