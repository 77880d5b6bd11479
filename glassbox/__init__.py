"""glassbox: a hooked, tested reimplementation of transformer LMs for mechanistic interpretability.

Layers, each importing only from the ones before it: ``glassbox.hooks`` -> ``glassbox.models`` ->
``glassbox.weights`` -> ``glassbox.interp`` -> ``glassbox.train``, ``glassbox.scale`` -> ``glassbox.tl``
-> ``glassbox.cli``.

``import glassbox`` imports nothing else (so that ``glassbox --help`` answers without loading torch);
the names below, and the subpackages as attributes, are imported on first use (PEP 562).
"""

import importlib

__version__ = "0.2.0"
__all__ = ["Config", "HOOK_SHAPES", "HookPoint", "HookedRootModule", "HookedTransformer"]
_HOME = {"Config": "models", "HOOK_SHAPES": "models", "HookedTransformer": "models", "HookPoint": "hooks",
         "HookedRootModule": "hooks"}
_SUBPACKAGES = ("cli", "hooks", "interp", "models", "scale", "tl", "train", "weights")


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    from .suggest import did_you_mean

    raise AttributeError(f"module 'glassbox' has no attribute {name!r}"
                         + did_you_mean(name, [*__all__, *_SUBPACKAGES, "__version__"]))


def __dir__() -> list:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
