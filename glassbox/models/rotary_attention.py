"""Attention with rotary position embeddings (RoPE) on queries and keys.

Same weights and hooks as ``Attention``, plus ``hook_rot_q`` and ``hook_rot_k`` [batch pos head
d_head]: q and k after rotation, which is what the scores are computed from (``hook_q``/``hook_k``
stay the unrotated projections). The key-value cache stores rotated keys, so cached positions are
never rotated twice. The pairing convention ("half" or "interleaved") is chosen at construction.

The cos/sin tables are a ``RotaryTable`` (``positional.py``), built for the positions actually used
and shared by all layers of one model with the same rotation (``components.share_rotary_tables``);
they are neither parameters nor buffers, so they are not in the state dict and cost nothing at
construction. A local layer uses ``cfg.rotary_base_local`` without rope scaling when that is set
(Gemma 3); every other layer uses ``rotary_base`` and ``cfg.rope_scaling``. With grouped-query
attention ``hook_rot_k`` has the kv-head axis of ``hook_k``. With the "dynamic" rope type the
frequencies follow the longest position of each forward (the table's state, as transformers'),
and keys already in the cache keep the rotation they were stored with.

Footgun: position ids must be below ``past + pos`` (the model's positions always are); the table is
grown to that length, not to n_ctx. The model checks lengths against n_ctx before this.
"""

from typing import Optional

from jaxtyping import Float, Int
from torch import Tensor

from ..hooks import HookPoint
from .attention import Attention
from .config import Config
from .positional import ROTATIONS, RotaryTable


class RotaryAttention(Attention):
    def __init__(self, cfg: Config, flags=None, layer: int = 0):
        super().__init__(cfg, flags, layer)
        if cfg.layer_attn_type(layer) == "local" and cfg.rotary_base_local is not None:
            self.rotary = RotaryTable(cfg.n_ctx, cfg.rotary_dim, cfg.rotary_base_local)
        else:
            self.rotary = RotaryTable(cfg.n_ctx, cfg.rotary_dim, cfg.rotary_base, cfg.rope_scaling)
        self.rotation = ROTATIONS[cfg.rotary_style]
        self.hook_rot_q = HookPoint()
        self.hook_rot_k = HookPoint()

    def rotate(self, q: Float[Tensor, "batch pos head d_head"], k: Float[Tensor, "batch pos kv_head d_head"],
               positions: Optional[Int[Tensor, "batch pos"]], past: int = 0) -> tuple:
        if positions is None:
            raise ValueError("rotary attention needs the position of every token (positions=None given)")
        # The dynamic rope type reads the sequence length off the positions (a device sync).
        cos, sin = self.rotary.tables(past + positions.shape[1], q.device, q.dtype, positions)
        # [batch pos 1 rotary_dim/2]: one angle per pair, shared by all heads.
        cos, sin = cos[positions][:, :, None], sin[positions][:, :, None]
        return self.hook_rot_q(self.rotation(q, cos, sin)), self.hook_rot_k(self.rotation(k, cos, sin))
