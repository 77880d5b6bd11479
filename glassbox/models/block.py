"""The pre-norm transformer block: resid_mid = resid_pre + attn(ln1(resid_pre)),
resid_post = resid_mid + mlp(ln2(resid_mid)). The norm, attention and MLP classes come from
``components.py`` (LayerNorm or RMSNorm, rotary or not, gated or not); post-norm, parallel and
attention-only blocks are in ``block_variants.py``.

Hook points that fire only under a hook flag (``hook_flags.py``; the block reads the model's shared
HookFlags on every forward): ``hook_attn_in`` (use_attn_in), ``hook_q_input``/``hook_k_input``/
``hook_v_input`` (use_split_qkv_input), each [batch pos head d_model], a fresh copy of resid_pre per
head, which ln1 then normalises ([batch pos head d_model] at ln1's hooks); ``hook_mlp_in``
(use_hook_mlp_in) [batch pos d_model], a copy of resid_mid before ln2. Copies, so that a hook editing
one in place changes nothing else. With every flag off the block runs exactly the unflagged code.
"""

from typing import Optional

from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from . import components
from .config import Config
from .hook_flags import HookFlags
from .kv_cache import LayerKV


def per_head_copy(resid: Float[Tensor, "batch pos d_model"], n_heads: int) -> Float[Tensor, "batch pos head d_model"]:
    """A fresh [batch pos head d_model] tensor holding resid once per head."""
    return resid.unsqueeze(2).repeat(1, 1, n_heads, 1)


class AttentionInputs(nn.Module):
    """A block's attention with its flag-gated input hooks (hook_attn_in, hook_q/k/v_input)."""

    def __init__(self, cfg: Config, layer: int, flags: Optional[HookFlags]):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.n_heads
        # Per-head key/value inputs: one per kv head (grouped-query), or per query head when ungrouped.
        self.n_kv_inputs = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_key_value_heads
        self.flags = flags if flags is not None else HookFlags()

    def add_attention_input_hooks(self) -> None:
        self.hook_attn_in = HookPoint()
        self.hook_q_input = HookPoint()
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()

    def attend(self, resid: Tensor, norm, positions, attn_mask, kv) -> Tensor:
        """attn(norm(resid)); under the input flags each head reads norm of its own copy of resid."""
        flags = self.flags
        if flags.use_split_qkv_input:
            q_in = self.hook_q_input(per_head_copy(resid, self.n_heads))
            k_in = self.hook_k_input(per_head_copy(resid, self.n_kv_inputs))
            v_in = self.hook_v_input(per_head_copy(resid, self.n_kv_inputs))
            return self.attn(norm(q_in), positions, attn_mask, kv, norm(k_in), norm(v_in))
        if flags.use_attn_in:
            return self.attn(norm(self.hook_attn_in(per_head_copy(resid, self.n_heads))), positions, attn_mask, kv)
        return self.attn(norm(resid), positions, attn_mask, kv)

    def mlp_input(self, resid: Tensor) -> Tensor:
        """What the MLP's norm reads: resid, or under use_hook_mlp_in a copy of it through hook_mlp_in."""
        return self.hook_mlp_in(resid.clone()) if self.flags.use_hook_mlp_in else resid


class TransformerBlock(AttentionInputs):
    def __init__(self, cfg: Config, layer: int, flags: Optional[HookFlags] = None):
        super().__init__(cfg, layer, flags)
        self.ln1 = components.norm(cfg)
        self.attn = components.attention(cfg, self.flags, layer)
        self.ln2 = components.norm(cfg)
        self.mlp = components.mlp(cfg)
        self.hook_resid_pre = HookPoint()
        self.add_attention_input_hooks()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_in = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        positions: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        kv: Optional[LayerKV] = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attend(resid, self.ln1, positions, attn_mask, kv))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid))))
        return self.hook_resid_post(resid + mlp_out)
