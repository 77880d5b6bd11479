"""The pre-norm transformer block: resid_mid = resid_pre + attn(ln1(resid_pre)),
resid_post = resid_mid + mlp(ln2(resid_mid)). The norm, attention and MLP classes come from
``components.py`` (LayerNorm or RMSNorm, rotary or not, gated or not); post-norm and parallel
blocks are in ``block_variants.py``."""

from typing import Optional

from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from . import components
from .config import Config
from .kv_cache import LayerKV


class TransformerBlock(nn.Module):
    def __init__(self, cfg: Config, layer: int):
        super().__init__()
        self.layer = layer
        self.ln1 = components.norm(cfg)
        self.attn = components.attention(cfg)
        self.ln2 = components.norm(cfg)
        self.mlp = components.mlp(cfg)
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
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
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid), positions, attn_mask, kv))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid + mlp_out)
