"""``transformer_lens.utilities.cache``: ``get_pos_offset``, the positions a key-value cache holds."""

from typing import Optional


def get_pos_offset(past_kv_cache: Optional[object], batch_size: int) -> int:
    """Positions already in ``past_kv_cache`` (0 without one): where the next tokens' positions start.
    ``batch_size`` is TransformerLens's argument and is not used."""
    if past_kv_cache is None:
        return 0
    return int(past_kv_cache.entries[0].past_keys.shape[1])


__all__ = ["get_pos_offset"]
