"""Error classes for bad arguments that TransformerLens reports with another built-in type.

glassbox refuses bad input with a ValueError naming what was wrong. Where TransformerLens asserts (or
lets torch raise a RuntimeError), code written for it catches that type instead; these classes are
both, so ``except ValueError`` and TransformerLens's ``except AssertionError`` / ``RuntimeError`` (and
its tests' ``pytest.raises``) all see them. They live in the bottom layer so any layer can raise them.
"""


class ArgumentError(ValueError, AssertionError):
    """A bad argument where TransformerLens asserts: a ValueError and an AssertionError."""


class BroadcastError(ValueError, RuntimeError):
    """Shapes that do not broadcast, where TransformerLens (or torch under it) raises RuntimeError."""


__all__ = ["ArgumentError", "BroadcastError"]
