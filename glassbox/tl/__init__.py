"""glassbox.tl: TransformerLens 3.x's HookedTransformer-era names, signatures and defaults on glassbox.

``import glassbox.tl as transformer_lens`` gives the classes and modules TransformerLens code uses;
``glassbox.tl.as_transformer_lens()`` registers this package (every submodule too) as
``transformer_lens``, so unchanged TransformerLens code runs on glassbox after that one line. The
layer adapts only: the computation, caching, patching and analysis are glassbox's own.
"""

import importlib.util

from . import components, hook_points
from . import loading_from_pretrained
from . import loading_from_pretrained as loading
from . import past_key_value_caching
from ._alias import as_transformer_lens
from .config import HookedTransformerConfig
from .FactoredMatrix import FactoredMatrix
from .hook_points import HookedRootModule, HookPoint
from .HookedTransformer import HookedTransformer
from .past_key_value_caching import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry

# TransformerLens 3.9's names for the same cache classes.
TransformerLensKeyValueCache = HookedTransformerKeyValueCache
TransformerLensKeyValueCacheEntry = HookedTransformerKeyValueCacheEntry

__all__ = ["FactoredMatrix", "HookPoint", "HookedRootModule", "HookedTransformer", "HookedTransformerConfig",
           "HookedTransformerKeyValueCache", "TransformerLensKeyValueCache", "TransformerLensKeyValueCacheEntry",
           "as_transformer_lens", "components", "hook_points", "loading",
           "loading_from_pretrained", "past_key_value_caching"]


def _optional(name: str) -> bool:
    """Whether the submodule ``name`` exists (so a missing one is skipped, a broken one still raises)."""
    return importlib.util.find_spec(f"{__name__}.{name}") is not None


# Each module is imported before its class of the same name is bound, so a later import of the module
# (``import glassbox.tl.ActivationCache``) cannot replace the class in this namespace.
if _optional("ActivationCache"):
    from .ActivationCache import ActivationCache  # noqa: E402

    __all__.append("ActivationCache")
if _optional("SVDInterpreter"):
    from .SVDInterpreter import SVDInterpreter  # noqa: E402

    __all__.append("SVDInterpreter")
for _name in ("utils", "patching", "evals", "head_detector"):
    if _optional(_name):
        globals()[_name] = importlib.import_module(f"{__name__}.{_name}")
        __all__.append(_name)
