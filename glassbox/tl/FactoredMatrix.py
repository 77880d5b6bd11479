"""TransformerLens's ``FactoredMatrix`` module: glassbox's FactoredMatrix (``glassbox.interp.factored_matrix``)."""

from ..interp.factored_matrix import FactoredMatrix

__all__ = ["FactoredMatrix"]
