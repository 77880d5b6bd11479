"""TransformerLens's ``AbstractAttention``: the base of ``Attention`` and ``GroupedQueryAttention``.

Built on their own, both take TransformerLens's constructor ``(cfg, attn_type="global",
layer_id=None)`` and forward ``(query_input, key_input, value_input, past_kv_cache_entry=None,
additive_attention_mask=None, attention_mask=None, position_bias=None)``, and compute with glassbox's
``glassbox.models.Attention`` (their base class too): same parameters (W_Q [head d_model d_head],
W_O [head d_head d_model], b_Q, b_K, b_V, b_O), hook points (hook_q, hook_k, hook_v,
hook_attn_scores, hook_pattern, hook_z, hook_result under ``cfg.use_attn_result``), the ``mask`` and
``IGNORE`` buffers of TransformerLens's state dict (TransformerLens 3.2's full [n_ctx n_ctx] mask loads
too, and is dropped: no forward reads it), and ``OV``/``QK``. Inputs of [batch pos head
d_model] are per-head inputs (TransformerLens's ``use_split_qkv_input``), whatever the flag says.

``isinstance`` follows TransformerLens: a glassbox model's attention is an ``AbstractAttention``, and
an ``Attention`` or a ``GroupedQueryAttention`` as its heads are grouped or not.

Refused, naming the argument: ``position_bias`` (T5's relative positions), an
``additive_attention_mask`` holding anything but 0 and -inf (only those are a mask), keys of another
length than the queries plus the cache, rotary positions (a standalone rotary attention is not
provided: build a HookedTransformer). Deliberate difference: under ``attention_mask`` a pad query
attends to itself as well (glassbox's models' mask, which keeps every softmax finite); TransformerLens
leaves it the real keys before it, or, with none, a zero pattern. Only pad queries' outputs differ,
which a model never reads.

``create_alibi_slope``, ``create_alibi_multipliers`` and ``create_alibi_bias`` are glassbox's ALiBi
tables (``glassbox.models.alibi``) under TransformerLens's names.
"""

import abc
from typing import Optional

import torch
from torch import Tensor, nn

from ...models import alibi
from ...models.attention import Attention as _GlassboxAttention
from ...models.masks import attention_mask_for
from ..config import HookedTransformerConfig
from ._standalone import CfgFlags, finish, standalone_config


class _AttentionMeta(abc.ABCMeta):
    """isinstance of TransformerLens's attention classes for glassbox's attentions (see ``_matches``)."""

    def __instancecheck__(cls, instance) -> bool:
        if super().__instancecheck__(instance):
            return True
        return isinstance(instance, _GlassboxAttention) and cls._matches(instance)


class AbstractAttention(nn.Module, metaclass=_AttentionMeta):
    @classmethod
    def _matches(cls, attention: _GlassboxAttention) -> bool:
        return cls is AbstractAttention

    create_alibi_slope = staticmethod(alibi.alibi_slope)
    create_alibi_multipliers = staticmethod(alibi.alibi_multipliers)
    create_alibi_bias = staticmethod(alibi.alibi_bias)

    @property
    def OV(self):
        from ...interp.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self):
        from ...interp.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))


class TLAttention(AbstractAttention, _GlassboxAttention, metaclass=_AttentionMeta):
    """The standalone construction and forward both classes share (see the module docstring)."""

    def __init__(self, cfg, attn_type: str = "global", layer_id: Optional[int] = None, grouped: bool = False):
        name = type(self).__name__
        tl_cfg, gcfg = standalone_config(cfg, name)
        if gcfg.positional != "learned":
            raise ValueError(f"{name}(cfg): a standalone attention of positional_embedding_type="
                             f"{tl_cfg.positional_embedding_type!r} is not provided (only 'standard'); build a "
                             "HookedTransformer, whose blocks hold rotary attentions")
        if attn_type not in ("global", "local"):
            raise ValueError(f"{name}: attn_type must be 'global' or 'local', got {attn_type!r}")
        if attn_type == "local" and (isinstance(tl_cfg.window_size, bool) or not isinstance(tl_cfg.window_size, int)
                                     or tl_cfg.window_size <= 0):
            raise ValueError(f"{name}: attn_type='local' needs cfg.window_size, a positive int; got "
                             f"{tl_cfg.window_size!r}")
        if layer_id is not None and (isinstance(layer_id, bool) or not isinstance(layer_id, int) or layer_id < 0):
            raise ValueError(f"{name}: layer_id must be an int >= 0 or None, got {layer_id!r}")
        if gcfg.scale_attn_by_inverse_layer_idx and layer_id is None:
            raise ValueError(f"{name}: cfg.scale_attn_by_inverse_layer_idx divides the scores by layer_id + 1, so "
                             "layer_id must be given")
        # The layer's own options (its local window) come from attn_type here, not from cfg.attn_types.
        changes = {"attn_types": None, "window_size": None}
        if not grouped:
            changes["n_key_value_heads"] = None  # TransformerLens's Attention has a key head per query head
        gcfg = gcfg.replace(**changes)
        super().__init__(gcfg, None, layer_id or 0)
        self.cfg = tl_cfg
        self.flags = CfgFlags(tl_cfg)  # read at each forward, as TransformerLens reads cfg.use_attn_result
        self.attn_type = attn_type
        self.layer_id = layer_id
        self._window = tl_cfg.window_size if attn_type == "local" else None
        self._buffers["mask"] = torch.empty(0, 0, dtype=torch.bool)
        self.register_buffer("IGNORE", torch.tensor(-torch.inf))
        finish(self, tl_cfg)

    @property
    def mask(self) -> Tensor:
        """TransformerLens's [0 0] ``mask`` buffer (never read: each forward builds its causal mask); a
        buffer, so assigning a tensor replaces it (nn.Module's rule), as in TransformerLens."""
        return self._buffers["mask"]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # TransformerLens 3.2 saved a full [n_ctx n_ctx] causal ``mask``; no forward reads it, so a 2-D bool
        # mask of another shape is taken as that buffer and the [0 0] placeholder kept (as TransformerLens 3.9)
        saved = state_dict.get(prefix + "mask")
        if isinstance(saved, Tensor) and saved.dtype == torch.bool and saved.ndim == 2 and saved.shape != self.mask.shape:
            state_dict = {**state_dict, prefix + "mask": self.mask}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, query_input: Tensor, key_input: Tensor, value_input: Tensor, past_kv_cache_entry=None,
                additive_attention_mask: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_bias: Optional[Tensor] = None) -> Tensor:
        if position_bias is not None:
            raise ValueError("position_bias (relative positional bias, T5's) is not supported by glassbox's attention")
        for arg, t in (("query_input", query_input), ("key_input", key_input), ("value_input", value_input)):
            if not isinstance(t, Tensor) or t.ndim not in (3, 4) or not t.dtype.is_floating_point:
                raise ValueError(f"{arg} must be a float [batch pos d_model] or [batch pos head d_model] tensor, got "
                                 + (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__))
        if key_input.shape[:2] != value_input.shape[:2] or key_input.shape[0] != query_input.shape[0]:
            raise ValueError(f"key_input {tuple(key_input.shape)}, value_input {tuple(value_input.shape)} and "
                             f"query_input {tuple(query_input.shape)} must share batch (and keys and values pos)")
        past = past_kv_cache_entry.length if past_kv_cache_entry is not None else 0
        query_len, key_len = query_input.shape[1], past + key_input.shape[1]
        if query_len + past != key_len:
            raise ValueError(f"query_input has {query_len} positions and the cache {past}, but key_input has "
                             f"{key_input.shape[1]}: causal self-attention needs as many new keys as queries")
        device = query_input.device
        key_mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != (query_input.shape[0], key_len):
                raise ValueError(f"attention_mask must be a [batch offset_pos] = {(query_input.shape[0], key_len)} tensor "
                                 "(1 for real tokens, cached positions included), got "
                                 + (str(tuple(attention_mask.shape)) if isinstance(attention_mask, Tensor) else
                                    type(attention_mask).__name__))
            key_mask = attention_mask.to(device).bool()
        mask = attention_mask_for(key_mask, query_len, key_len, device, window=self._window)
        if additive_attention_mask is not None:
            mask = self._with_additive(mask, additive_attention_mask, query_input.shape[0], query_len, key_len, device)
        return super().forward(query_input, None, mask, past_kv_cache_entry, k_input=key_input, v_input=value_input)

    def _with_additive(self, mask, additive: Tensor, batch: int, query_len: int, key_len: int, device) -> Tensor:
        if not isinstance(additive, Tensor) or not additive.dtype.is_floating_point:
            raise ValueError("additive_attention_mask must be a float tensor of 0 and -inf, broadcastable to "
                             "[batch head query_pos key_pos]")
        additive = additive.to(device)
        keep = additive == 0
        if not bool((keep | (additive == float("-inf"))).all()):
            raise ValueError("additive_attention_mask holds values other than 0 and -inf; glassbox's attention takes "
                             "a mask (0: attend, -inf: do not), not finite biases on the scores")
        full = (batch, self.cfg.n_heads, query_len, key_len)
        try:
            fits = torch.broadcast_shapes(additive.shape, full) == full
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"additive_attention_mask {tuple(additive.shape)} does not broadcast to [batch head "
                             f"query_pos key_pos] = {full}")
        if mask is None:
            mask = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)
        return mask & keep


__all__ = ["AbstractAttention"]
