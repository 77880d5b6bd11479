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


class KeysError(KeyError, ValueError):
    """Keys missing from a mapping or not expected in it (a state dict's): a KeyError, and a ValueError as
    TransformerLens raises for weights missing from a state dict."""


__all__ = ["ArgumentError", "BroadcastError", "KeysError"]
