"""Which component class computes each part of a model, chosen once from the Config.

This is the only place that reads the architectural options; the components themselves never
branch on them in forward. ``positional_embedding`` returns None for rotary models, whose
positions enter through the attention instead of the residual stream.
"""

from typing import Optional

from torch import nn

from .attention import Attention
from .config import Config
from .embed import PosEmbed
from .gated_mlp import GatedMLP
from .hook_flags import HookFlags
from .layer_norm import LayerNorm
from .mlp import MLP
from .normed_mlp import NormedMLP
from .positional import SinusoidalPosEmbed
from .rms_norm import RMSNorm
from .rotary_attention import RotaryAttention

NORMS = {"LN": LayerNorm, "RMS": RMSNorm}
POS_EMBEDS = {"learned": PosEmbed, "sinusoidal": SinusoidalPosEmbed, "rotary": None}


def norm(cfg: Config) -> nn.Module:
    return NORMS[cfg.normalization](cfg)


def attention(cfg: Config, flags: Optional[HookFlags] = None, layer: int = 0) -> Attention:
    """The attention class for the positions, built for ``layer`` (its scale, local or global rotation);
    ``flags`` is the model's HookFlags (shared, read per forward)."""
    cls = RotaryAttention if cfg.positional == "rotary" else Attention
    return cls(cfg, flags, layer)


def mlp(cfg: Config) -> nn.Module:
    if cfg.mlp_ln:
        return NormedMLP(cfg)
    return GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)


def positional_embedding(cfg: Config) -> Optional[nn.Module]:
    cls = POS_EMBEDS[cfg.positional]
    return cls(cfg) if cls is not None else None


def share_rotary_tables(blocks: nn.ModuleList) -> None:
    """Give the rotary attentions of equal rotation one table (grown once, cast once per device and dtype)."""
    tables = {}
    for b in blocks:
        attn = getattr(b, "attn", None)
        if isinstance(attn, RotaryAttention):
            attn.rotary = tables.setdefault(attn.rotary.key, attn.rotary)


def final_norm(cfg: Config) -> nn.Module:
    """Every placement but "post" normalises before the unembedding; post-norm blocks end in a norm."""
    return nn.Identity() if cfg.norm_placement == "post" else norm(cfg)
