"""glassbox: a hooked, tested reimplementation of GPT-2 for mechanistic interpretability.

Layers, each importing only from the ones before it: ``glassbox.hooks`` -> ``glassbox.models`` ->
``glassbox.weights`` -> ``glassbox.interp``.
"""

from .hooks import HookedRootModule, HookPoint
from .models import HOOK_SHAPES, Config, HookedTransformer

__version__ = "0.2.0"
__all__ = ["Config", "HOOK_SHAPES", "HookPoint", "HookedRootModule", "HookedTransformer"]
