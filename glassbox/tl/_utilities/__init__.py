"""Modules of TransformerLens 3.x's ``utilities`` package that hold names glassbox.tl.utils does not.

``as_transformer_lens()`` registers each under its TransformerLens path (``_alias.SUBMODULES``), e.g.
``transformer_lens.utilities.logits_utils``; the names are also in ``glassbox.tl.utils`` where
TransformerLens's ``utilities`` exports them.
"""
