"""glassbox.tl: TransformerLens 3.x's HookedTransformer-era names, signatures and defaults on glassbox.

``import glassbox.tl as transformer_lens`` gives the classes and modules TransformerLens code uses;
``glassbox.tl.as_transformer_lens()`` registers this package (every submodule too) as
``transformer_lens``, so unchanged TransformerLens code runs on glassbox after that one line. The
layer adapts only: the computation, caching, patching and analysis are glassbox's own.
"""

from . import cache, components, evals, head_detector, hook_points, patching, utils
from . import loading_from_pretrained
from . import loading_from_pretrained as loading
from . import past_key_value_caching
from ._alias import as_transformer_lens
from .ActivationCache import ActivationCache
from .config import HookedTransformerConfig
from .FactoredMatrix import FactoredMatrix
from .hook_points import HookPoint
from .HookedRootModule import HookedRootModule  # the module first, then its class over its name
from .HookedTransformer import HookedTransformer
from .past_key_value_caching import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry
from .SVDInterpreter import SVDInterpreter

# TransformerLens 3.x's own modules import its helpers as transformer_lens.utilities.
utilities = utils

# TransformerLens 3.9's names for the same cache classes (also in glassbox.tl.cache).
from .cache import TransformerLensKeyValueCache, TransformerLensKeyValueCacheEntry  # noqa: E402

__all__ = ["ActivationCache", "FactoredMatrix", "HookPoint", "HookedRootModule", "HookedTransformer",
           "HookedTransformerConfig", "HookedTransformerKeyValueCache", "SVDInterpreter",
           "TransformerLensKeyValueCache", "TransformerLensKeyValueCacheEntry", "as_transformer_lens", "cache", "components",
           "evals", "head_detector", "hook_points", "loading", "loading_from_pretrained", "past_key_value_caching",
           "patching", "utilities", "utils"]

