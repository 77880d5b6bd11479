"""TransformerLens's ``past_key_value_caching``: its cache classes as glassbox's KVCache.

``HookedTransformerKeyValueCache.init_cache(cfg, device, batch_size)`` gives an empty cache for a
model of ``cfg``; pass it as ``past_kv_cache=`` to successive forwards. glassbox's cache allocates on
the first forward (on the model's device, at the input's batch size), so ``device`` and
``batch_size`` are kept for reference only. ``freeze()`` / ``unfreeze()`` and ``frozen`` (on the cache
and on each entry) are glassbox's (``glassbox.models.kv_cache``): a frozen cache is read, not extended.

Differences: ``previous_attention_mask`` is glassbox's bool mask, None while every cached token is
real (TransformerLens: an int tensor, [batch 0] when empty); ``append_attention_mask`` returns the
bool mask over cached and new positions. Called outside a forward it makes the mask longer than
the cached keys, which the next forward refuses (TransformerLens then misplaces positions).
"""

from ..models.kv_cache import KVCache, LayerKV


class HookedTransformerKeyValueCacheEntry(LayerKV):
    """One layer's keys and values [batch key_pos head d_head] (``past_keys`` / ``past_values``)."""

    past_keys = property(lambda self: self.k)
    past_values = property(lambda self: self.v)


class HookedTransformerKeyValueCache(KVCache):
    def __init__(self, n_layers: int, device=None, batch_size: int = 1):
        super().__init__(n_layers)
        self.layers = [HookedTransformerKeyValueCacheEntry() for _ in range(n_layers)]
        self.device, self.batch_size = device, batch_size

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1) -> "HookedTransformerKeyValueCache":
        return cls(cfg.n_layers, device, batch_size)

    @property
    def entries(self) -> list:
        return self.layers

    @property
    def previous_attention_mask(self):
        """[batch key_pos] mask of the cached positions (None while every token was real)."""
        return self.key_mask

    def append_attention_mask(self, attention_mask):
        """The mask over the cached and the new positions; kept unless the cache is frozen."""
        return self.append_mask(attention_mask)


__all__ = ["HookedTransformerKeyValueCache", "HookedTransformerKeyValueCacheEntry"]
