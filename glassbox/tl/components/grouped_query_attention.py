"""TransformerLens's ``GroupedQueryAttention``: ``cfg.n_key_value_heads`` key/value heads shared by groups of
query heads, built on its own from ``GroupedQueryAttention(cfg, attn_type="global", layer_id=None)``
(see ``abstract_attention``).

TransformerLens's names: the stored key/value weights are ``_W_K``, ``_W_V`` [kv_head d_model d_head]
and ``_b_K``, ``_b_V`` [kv_head d_head] (the state dict's keys); ``W_K``, ``W_V``, ``b_K``, ``b_V`` are
those repeated to one per query head (query head h reads kv head h // (n_heads / n_key_value_heads)),
new tensors for reading, not parameters. ``hook_k``/``hook_v`` are [batch pos kv_head d_head], or
[batch pos head d_head] with ``cfg.ungroup_grouped_query_attention``.
"""

from typing import Optional

from torch import Tensor

from ...models.attention import Attention as _GlassboxAttention
from .abstract_attention import TLAttention

_STORED = ("W_K", "W_V", "b_K", "b_V")


class GroupedQueryAttention(TLAttention):
    @classmethod
    def _matches(cls, attention: _GlassboxAttention) -> bool:
        return cls is GroupedQueryAttention and attention.kv_weights()[0].shape[0] != attention.W_Q.shape[0]

    def __init__(self, cfg, attn_type: str = "global", layer_id: Optional[int] = None):
        from ._standalone import standalone_config

        tl_cfg, _ = standalone_config(cfg, "GroupedQueryAttention")
        if tl_cfg.n_key_value_heads is None:
            raise ValueError("GroupedQueryAttention: cfg.n_key_value_heads is not set (None); give the number of "
                             "key/value heads, or use Attention")
        super().__init__(tl_cfg, attn_type, layer_id, grouped=True)
        for name in _STORED:  # the same Parameter objects under TransformerLens's names
            self._parameters["_" + name] = self._parameters.pop(name)

    def kv_weights(self) -> tuple:
        return self._W_K, self._b_K, self._W_V, self._b_V

    def _repeated(self, name: str) -> Tensor:
        stored = self._parameters.get("_" + name)
        if stored is None:  # during glassbox's __init__, before the rename (hasattr must say no)
            raise AttributeError(name)
        return stored.repeat_interleave(self.cfg.n_heads // self.cfg.n_key_value_heads, dim=0)

    W_K = property(lambda self: self._repeated("W_K"), doc="[head d_model d_head]: _W_K repeated per query head")
    W_V = property(lambda self: self._repeated("W_V"), doc="[head d_model d_head]: _W_V repeated per query head")
    b_K = property(lambda self: self._repeated("b_K"), doc="[head d_head]: _b_K repeated per query head")
    b_V = property(lambda self: self._repeated("b_V"), doc="[head d_head]: _b_V repeated per query head")


__all__ = ["GroupedQueryAttention"]
