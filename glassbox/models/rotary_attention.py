"""Attention with rotary position embeddings (RoPE) on queries and keys.

Same weights and hooks as ``Attention``, plus ``hook_rot_q`` and ``hook_rot_k`` [batch pos head
d_head]: q and k after rotation, which is what the scores are computed from (``hook_q``/``hook_k``
stay the unrotated projections). The key-value cache stores rotated keys, so cached positions are
never rotated twice. The pairing convention ("half" or "interleaved") is chosen at construction.

Footgun: positions index a table of n_ctx rows; the model checks lengths against n_ctx before this.
"""

from typing import Optional

from jaxtyping import Float, Int
from torch import Tensor

from ..hooks import HookPoint
from .attention import Attention
from .config import Config
from .positional import ROTATIONS, rotary_tables


class RotaryAttention(Attention):
    def __init__(self, cfg: Config):
        super().__init__(cfg)
        cos, sin = rotary_tables(cfg.n_ctx, cfg.rotary_dim, cfg.rotary_base)
        self.register_buffer("rotary_cos", cos, persistent=False)  # [n_ctx rotary_dim/2]
        self.register_buffer("rotary_sin", sin, persistent=False)
        self.rotation = ROTATIONS[cfg.rotary_style]
        self.hook_rot_q = HookPoint()
        self.hook_rot_k = HookPoint()

    def rotate(self, q: Float[Tensor, "batch pos head d_head"], k: Float[Tensor, "batch pos head d_head"],
               positions: Optional[Int[Tensor, "batch pos"]]) -> tuple:
        if positions is None:
            raise ValueError("rotary attention needs the position of every token (positions=None given)")
        # [batch pos 1 rotary_dim/2]: one angle per pair, shared by all heads.
        cos, sin = self.rotary_cos[positions][:, :, None], self.rotary_sin[positions][:, :, None]
        return self.hook_rot_q(self.rotation(q, cos, sin)), self.hook_rot_k(self.rotation(k, cos, sin))
