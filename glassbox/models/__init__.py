"""Hooked transformer components, the model, its config and the table of hook shapes."""

from .attention import Attention
from .block import TransformerBlock
from .config import Config
from .embed import Embed, PosEmbed, Unembed
from .hook_shapes import HOOK_SHAPES, hook_pattern, hook_shape
from .kv_cache import KVCache
from .layer_norm import LayerNorm
from .mlp import MLP
from .tokenize import GPT2_TOKENIZER_DIR, gpt2_tokenizer
from .transformer import HookedTransformer, lm_loss

__all__ = [
    "Attention", "Config", "Embed", "GPT2_TOKENIZER_DIR", "HOOK_SHAPES", "HookedTransformer", "KVCache",
    "LayerNorm", "MLP", "PosEmbed", "TransformerBlock", "Unembed", "gpt2_tokenizer", "hook_pattern",
    "hook_shape", "lm_loss",
]
