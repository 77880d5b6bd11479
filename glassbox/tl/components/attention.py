"""TransformerLens's ``Attention``: multi-head attention, one key/value head per query head, built on its own
from ``Attention(cfg, attn_type="global", layer_id=None)`` (see ``abstract_attention``). A config's
``n_key_value_heads`` is ignored here, as in TransformerLens (``GroupedQueryAttention`` reads it)."""

from typing import Optional

from ...models.attention import Attention as _GlassboxAttention
from .abstract_attention import TLAttention


class Attention(TLAttention):
    @classmethod
    def _matches(cls, attention: _GlassboxAttention) -> bool:
        return cls is Attention and attention.kv_weights()[0].shape[0] == attention.W_Q.shape[0]

    def __init__(self, cfg, attn_type: str = "global", layer_id: Optional[int] = None):
        super().__init__(cfg, attn_type, layer_id, grouped=False)


__all__ = ["Attention"]
