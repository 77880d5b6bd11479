"""TransformerLens 3.9's ``cache`` package: its key-value cache classes under their 3.9 module paths."""

from .key_value_cache import TransformerLensKeyValueCache
from .key_value_cache_entry import TransformerLensKeyValueCacheEntry

__all__ = ["TransformerLensKeyValueCache", "TransformerLensKeyValueCacheEntry"]
