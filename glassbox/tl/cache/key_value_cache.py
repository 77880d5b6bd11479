"""``transformer_lens.cache.key_value_cache``: the key-value cache (see ``past_key_value_caching``)."""

from ..past_key_value_caching import HookedTransformerKeyValueCache as TransformerLensKeyValueCache

__all__ = ["TransformerLensKeyValueCache"]
