"""TransformerLens's ``CanBeUsedAsMLP``: the class of every MLP module (glassbox's MLP and GatedMLP
are registered as its subclasses, so ``isinstance(block.mlp, CanBeUsedAsMLP)`` holds)."""

import abc

from ....models import GatedMLP, MLP


class CanBeUsedAsMLP(abc.ABC):
    """Marker base: any module a block uses as its MLP."""


CanBeUsedAsMLP.register(MLP)
CanBeUsedAsMLP.register(GatedMLP)
