"""TransformerLens's ``components``: glassbox's components under TransformerLens's names (for imports
and isinstance checks; build models through HookedTransformer, not component by component)."""

from ...models import (Attention, Embed, GatedMLP, LayerNorm, MLP, RMSNorm, TransformerBlock,
                       Unembed)
from . import mlps
from .pos_embed import PosEmbed

__all__ = ["Attention", "Embed", "GatedMLP", "LayerNorm", "MLP", "PosEmbed", "RMSNorm", "TransformerBlock",
           "Unembed", "mlps"]
