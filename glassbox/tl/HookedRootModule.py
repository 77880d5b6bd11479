"""``transformer_lens.HookedRootModule`` (a module in TransformerLens 3.9): glassbox's HookedRootModule."""

from ..hooks import HookedRootModule

__all__ = ["HookedRootModule"]
