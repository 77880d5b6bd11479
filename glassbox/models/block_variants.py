"""Blocks other than the pre-norm one, and the choice between them.

Post-norm (the original Transformer's): resid_mid = ln1(resid_pre + attn_out),
resid_post = ln2(resid_mid + mlp_out); there is no final norm before the unembedding. Here
``hook_resid_mid`` and ``hook_resid_post`` are norm outputs, so resid_mid != resid_pre + attn_out:
decompositions of the residual stream into component outputs do not hold for post-norm models.
Under the input flags the attention reads the per-head copies of resid_pre directly (no norm comes
before it), and ``hook_mlp_in`` is a copy of resid_mid, the MLP's input.

Parallel (GPT-J's): attention and MLP both read ln1(resid_pre) and
resid_post = resid_pre + attn_out + mlp_out; there is no ln2 and no ``hook_resid_mid``. Of the hook
flags only use_attn_result applies (``hook_flags.check_flags`` refuses the others by name).

Sandwich (Gemma 2 and 3): resid_mid = resid_pre + ln1_post(attn(ln1(resid_pre))),
resid_post = resid_mid + ln2_post(mlp(ln2(resid_mid))); ``hook_attn_out`` and ``hook_mlp_out`` are the
post-norms' outputs, what is added to the residual stream (as in TransformerLens).

Output-norm (OLMo 2): resid_mid = resid_pre + ln1(attn(resid_pre)), resid_post = resid_mid +
ln2(mlp(resid_mid)): ln1 and ln2 normalise the sublayers' outputs (TransformerLens's names for OLMo
2); the attention and the MLP read the residual stream itself. Under the input flags the attention
reads the per-head copies directly, and ``hook_mlp_in`` is a copy of resid_mid.

Parallel with ``cfg.parallel_ln2`` (GPT-NeoX): the MLP reads ln2(resid_pre), its own norm, and
``hook_mlp_in`` (use_hook_mlp_in) is a copy of resid_pre before ln2, as in TransformerLens.

Attention-only (TransformerLens's attn_only): resid_post = resid_pre + attn(ln1(resid_pre)); no ln2,
no MLP, no ``hook_resid_mid``, ``hook_mlp_in`` or ``hook_mlp_out``, as in TransformerLens 3.9, where
only these hook points fire in such a block.
"""

from typing import Optional

from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from . import components
from .block import AttentionInputs, TransformerBlock
from .config import Config
from .hook_flags import HookFlags
from .kv_cache import LayerKV


def _identity(x: Tensor) -> Tensor:
    return x


class PostNormBlock(TransformerBlock):
    """Same submodules and hook points as the pre-norm block; only the order differs."""

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        positions: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        kv: Optional[LayerKV] = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attend(resid, _identity, positions, attn_mask, kv))
        resid = self.hook_resid_mid(self.ln1(resid + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(self.mlp_input(resid)))
        return self.hook_resid_post(self.ln2(resid + mlp_out))


class SandwichBlock(TransformerBlock):
    """The pre-norm block with a norm after each sublayer as well (ln1_post, ln2_post)."""

    def __init__(self, cfg: Config, layer: int, flags: Optional[HookFlags] = None):
        super().__init__(cfg, layer, flags)
        self.ln1_post = components.norm(cfg)
        self.ln2_post = components.norm(cfg)

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        positions: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        kv: Optional[LayerKV] = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.ln1_post(self.attend(resid, self.ln1, positions, attn_mask, kv)))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(self.mlp_input(resid)))))
        return self.hook_resid_post(resid + mlp_out)


class OutputNormBlock(TransformerBlock):
    """Sublayers read the residual stream; ln1 and ln2 normalise their outputs before the sum."""

    def forward(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        positions: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        kv: Optional[LayerKV] = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.ln1(self.attend(resid, _identity, positions, attn_mask, kv)))
        resid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.ln2(self.mlp(self.mlp_input(resid))))
        return self.hook_resid_post(resid + mlp_out)


class ParallelBlock(AttentionInputs):
    def __init__(self, cfg: Config, layer: int, flags: Optional[HookFlags] = None):
        super().__init__(cfg, layer, flags)
        self.ln1 = components.norm(cfg)
        self.attn = components.attention(cfg, self.flags, layer)
        self.hook_resid_pre = HookPoint()
        if cfg.parallel_ln2:  # the attention's input is its own: the input flags apply
            self.add_attention_input_hooks()
            self.ln2 = components.norm(cfg)
            self.hook_mlp_in = HookPoint()
        self.mlp = components.mlp(cfg)
        self.hook_attn_out = HookPoint()
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
        if hasattr(self, "ln2"):  # GPT-NeoX: two norms of resid_pre
            attn_out = self.hook_attn_out(self.attend(resid, self.ln1, positions, attn_mask, kv))
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid))))
            return self.hook_resid_post(resid + attn_out + mlp_out)
        normed = self.ln1(resid)
        attn_out = self.hook_attn_out(self.attn(normed, positions, attn_mask, kv))
        mlp_out = self.hook_mlp_out(self.mlp(normed))
        return self.hook_resid_post(resid + attn_out + mlp_out)


class AttnOnlyBlock(AttentionInputs):
    def __init__(self, cfg: Config, layer: int, flags: Optional[HookFlags] = None):
        super().__init__(cfg, layer, flags)
        self.ln1 = components.norm(cfg)
        self.attn = components.attention(cfg, self.flags, layer)
        self.hook_resid_pre = HookPoint()
        self.add_attention_input_hooks()
        self.hook_attn_out = HookPoint()
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
        return self.hook_resid_post(resid + attn_out)


def block(cfg: Config, layer: int, flags: Optional[HookFlags] = None) -> nn.Module:
    """The block class the config asks for, built for ``layer``, reading the model's ``flags``."""
    if cfg.attn_only:
        return AttnOnlyBlock(cfg, layer, flags)
    if cfg.parallel_attn_mlp:
        return ParallelBlock(cfg, layer, flags)
    cls = {"pre": TransformerBlock, "post": PostNormBlock, "sandwich": SandwichBlock,
           "output": OutputNormBlock}[cfg.norm_placement]
    return cls(cfg, layer, flags)
