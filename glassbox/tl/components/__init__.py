"""TransformerLens's ``components``: its classes under its names.

``Attention``, ``GroupedQueryAttention`` (and their base ``AbstractAttention``), ``MLP``, ``GatedMLP``
(and ``CanBeUsedAsMLP``) are built on their own from a TransformerLens config with TransformerLens's
constructors and forwards, computing with glassbox's modules (their base classes); a glassbox model's
own attentions and MLPs are instances of them for ``isinstance``. ``LayerNorm``, ``LayerNormPre``,
``RMSNorm`` and ``RMSNormPre`` take TransformerLens's constructors (``norms``). ``Embed``, ``Unembed``
and ``TransformerBlock`` are glassbox's classes (for imports and isinstance checks; build those
through HookedTransformer).
"""

from ...models import Embed, TransformerBlock, Unembed
from . import mlps
from .abstract_attention import AbstractAttention
from .attention import Attention
from .grouped_query_attention import GroupedQueryAttention
from .mlps import CanBeUsedAsMLP, GatedMLP, MLP
from .norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from .pos_embed import PosEmbed

__all__ = ["AbstractAttention", "Attention", "CanBeUsedAsMLP", "Embed", "GatedMLP", "GroupedQueryAttention",
           "LayerNorm", "LayerNormPre", "MLP", "PosEmbed", "RMSNorm", "RMSNormPre", "TransformerBlock", "Unembed",
           "mlps"]
