"""TransformerLens's ``components``: glassbox's components under TransformerLens's names (for imports
and isinstance checks; build models through HookedTransformer, not component by component)."""

from ...models import Attention, Embed, GatedMLP, MLP, TransformerBlock, Unembed
from . import mlps
from .norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from .pos_embed import PosEmbed

__all__ = ["Attention", "Embed", "GatedMLP", "LayerNorm", "LayerNormPre", "MLP", "PosEmbed", "RMSNorm", "RMSNormPre",
           "TransformerBlock", "Unembed", "mlps"]
