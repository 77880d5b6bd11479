"""Hooked transformer components, the model, its config and the table of hook shapes."""

from .attention import Attention
from .block import TransformerBlock
from .block_variants import ParallelBlock, PostNormBlock
from .config import Config
from .embed import Embed, PosEmbed, Unembed
from .gated_mlp import GatedMLP
from .hook_flags import HookFlagError, HookFlags
from .hook_shapes import HOOK_SHAPES, hook_pattern, hook_shape
from .kv_cache import KVCache
from .layer_norm import LayerNorm
from .mlp import MLP
from .normed_mlp import NormedMLP
from .positional import SinusoidalPosEmbed
from .presets import PRESETS, preset_config
from .rms_norm import RMSNorm
from .rotary_attention import RotaryAttention
from .tokenize import GPT2_TOKENIZER_DIR, gpt2_tokenizer
from .transformer import HookedTransformer, lm_loss

__all__ = [
    "Attention", "Config", "Embed", "GPT2_TOKENIZER_DIR", "GatedMLP", "HOOK_SHAPES", "HookFlagError", "HookFlags",
    "HookedTransformer",
    "KVCache", "LayerNorm", "MLP", "NormedMLP", "PRESETS", "ParallelBlock", "PosEmbed", "PostNormBlock", "RMSNorm",
    "RotaryAttention", "SinusoidalPosEmbed", "TransformerBlock", "Unembed", "gpt2_tokenizer",
    "hook_pattern", "hook_shape", "lm_loss", "preset_config",
]
