"""TransformerLens's ``components.mlps``: ``MLP``, ``GatedMLP`` and their base ``CanBeUsedAsMLP``, each
constructed from a TransformerLens config (see their modules). A glassbox model's own MLPs are
glassbox's classes (``isinstance(block.mlp, CanBeUsedAsMLP)`` holds for them)."""

from .can_be_used_as_mlp import CanBeUsedAsMLP
from .gated_mlp import GatedMLP
from .mlp import MLP

__all__ = ["CanBeUsedAsMLP", "GatedMLP", "MLP"]
