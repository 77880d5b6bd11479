"""Interpretability on a hooked model: the activation cache and its analysis."""

from .act_names import act_name
from .activation_cache import ActivationCache
from .cache import CacheSizeWarning, cache_size, run_with_cache

__all__ = ["ActivationCache", "CacheSizeWarning", "act_name", "cache_size", "run_with_cache"]
