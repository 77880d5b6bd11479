"""``transformer_lens.cache.key_value_cache_entry``: one layer's entry (see ``past_key_value_caching``)."""

from ..past_key_value_caching import HookedTransformerKeyValueCacheEntry as TransformerLensKeyValueCacheEntry

__all__ = ["TransformerLensKeyValueCacheEntry"]
