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

import torch

from ..models.kv_cache import KVCache, LayerKV


class HookedTransformerKeyValueCacheEntry(LayerKV):
    """One layer's keys and values [batch key_pos head d_head] (``past_keys`` / ``past_values``);
    constructed as TransformerLens's dataclass, ``(past_keys, past_values, frozen=False)``, or empty."""

    def __init__(self, past_keys=None, past_values=None, frozen: bool = False):
        super().__init__()
        if (past_keys is None) != (past_values is None) or (
                past_keys is not None and (past_keys.ndim != 4 or past_keys.shape != past_values.shape)):
            raise ValueError("past_keys and past_values must both be given, each [batch pos head d_head] of one "
                             f"shape, got {_shape(past_keys)} and {_shape(past_values)}")
        self.k, self.v, self.frozen = past_keys, past_values, bool(frozen)

    @classmethod
    def init_cache_entry(cls, cfg, device=None, batch_size: int = 1) -> "HookedTransformerKeyValueCacheEntry":
        """An entry holding no position yet: keys and values [batch_size 0 head d_head] in ``cfg.dtype`` on
        ``device``, with ``cfg.n_key_value_heads`` heads where set (grouped-query attention)."""
        heads = cfg.n_key_value_heads if cfg.n_key_value_heads is not None else cfg.n_heads
        shape = (batch_size, 0, heads, cfg.d_head)
        return cls(torch.empty(shape, device=device, dtype=cfg.dtype), torch.empty(shape, device=device, dtype=cfg.dtype))

    past_keys = property(lambda self: self.k)
    past_values = property(lambda self: self.v)


def _shape(x):
    return None if x is None else tuple(x.shape)


class HookedTransformerKeyValueCache(KVCache):
    """The cache of every layer: TransformerLens's dataclass ``(entries, previous_attention_mask,
    frozen=False)``; ``init_cache(cfg, device, batch_size)`` for an empty one."""

    def __init__(self, entries: list, previous_attention_mask=None, frozen: bool = False):
        if isinstance(entries, (int, bool)) or not all(isinstance(e, LayerKV) for e in entries) or not entries:
            raise ValueError("entries must be a non-empty list of HookedTransformerKeyValueCacheEntry, one a layer "
                             f"(init_cache(cfg) makes an empty cache), got {entries!r:.80}")
        super().__init__(len(entries))
        self.layers = list(entries)
        self.device, self.batch_size = None, None
        if previous_attention_mask is not None and previous_attention_mask.shape[-1] > 0:
            mask = previous_attention_mask.bool()
            if mask.shape[-1] != len(self):
                raise ValueError(f"previous_attention_mask covers {mask.shape[-1]} positions, the entries hold "
                                 f"{len(self)}")
            self.key_mask = None if bool(mask.all()) else mask
        if frozen:
            self.freeze()

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1) -> "HookedTransformerKeyValueCache":
        cache = cls([HookedTransformerKeyValueCacheEntry() for _ in range(cfg.n_layers)])
        cache.device, cache.batch_size = device, batch_size
        return cache

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
