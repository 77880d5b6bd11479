"""Small seeded models and transcoder sets for the attribution-graph tests (distinct sizes, so that a
swapped axis fails): a GPT-2-style LayerNorm model, a Llama-style RMSNorm/rotary/SwiGLU one, a
Gemma-2-style sandwich-norm one, a GPT-J-style parallel one and a post-norm one."""

import torch

from glassbox import HookedTransformer
from glassbox.interp.transcoders import seeded_set
from glassbox.models.presets import preset_config

D_MODEL, N_LAYERS, N_HEADS, D_VOCAB, N_CTX = 30, 3, 3, 53, 37

FAMILIES = {
    "gpt2": ("gpt2", {}, "ln2.hook_normalized"),
    "llama": ("modern", {"d_mlp": 44}, "ln2.hook_normalized"),
    "gemma2": ("modern", {"d_mlp": 44, "norm_placement": "sandwich"}, "ln2.hook_normalized"),
    "gptj": ("gpt2", {"parallel_attn_mlp": True, "positional": "rotary", "rotary_dim": 4}, "ln1.hook_normalized"),
    "postnorm": ("classic", {}, "hook_resid_mid"),
}


def family_model(family: str, seed: int = 0, dtype=torch.float32, scale: float = 4.0):
    """A seeded random model whose weights (matrices) are scaled up so that attention is far from uniform."""
    preset, extra, input_hook = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = preset_config(preset, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS, d_vocab=D_VOCAB, n_ctx=N_CTX,
                        **extra)
    model = HookedTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.mul_(scale)
    return model.to(dtype), input_hook


def family_transcoders(family: str, d_transcoder: int = 47, seed: int = 1, dtype=torch.float32, n_layers=N_LAYERS,
                       **kw):
    """A seeded TranscoderSet on the family's MLP input; bias -0.5: about a third of the features fire."""
    kw.setdefault("input_hook", FAMILIES[family][2])
    kw.setdefault("bias", -0.5)
    return seeded_set(n_layers, D_MODEL, d_transcoder, seed=seed, dtype=dtype, **kw)
