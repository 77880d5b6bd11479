"""Named architectures: ``preset_config("modern", d_model=..., ...)`` -> Config.

- "gpt2": learned positions, pre-LayerNorm, GELU (tanh) MLP of width 4 d_model, biases, tied
  unembedding, GPT-2's initialisation (the Config defaults).
- "modern": rotary positions (theta 10000, "half" pairing, every head dim), pre-RMSNorm, SwiGLU MLP
  of width ~8/3 d_model (rounded up to a multiple of 8), no biases, separate unembedding,
  truncated-normal initialisation.
- "classic": sinusoidal positions added to the token embedding, ReLU MLP of width 4 d_model,
  post-LayerNorm (x = LN(x + f(x)) after each sublayer), biases, separate unembedding, and the
  truncated-normal initialisation: token embeddings of unit scale like the sinusoids they are added
  to (with GPT-2's std 0.02 the positions drown the tokens, and a small model learns little more
  than letter frequencies), Xavier-scaled projections.

Sizes and any other Config field are keyword arguments and override the preset.
"""

import math

from .config import Config

PRESETS = {
    "gpt2": {},
    "modern": {"normalization": "RMS", "positional": "rotary", "rotary_style": "half", "rotary_base": 10000.0,
               "act_fn": "silu", "gated_mlp": True, "use_bias": False, "tied_unembed": False,
               "init_scheme": "truncated_normal"},
    "classic": {"normalization": "LN", "norm_placement": "post", "positional": "sinusoidal", "act_fn": "relu",
                "tied_unembed": False, "init_scheme": "truncated_normal"},
}
DEFAULT_SIZES = {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_vocab": 50257, "n_ctx": 1024}


def swiglu_width(d_model: int, multiple: int = 8) -> int:
    """~8/3 d_model (keeps a gated MLP's parameter count equal to a 4 d_model ungated one), rounded up."""
    return multiple * math.ceil(8 * d_model / 3 / multiple)


def preset_config(name: str, **fields) -> Config:
    """The Config of a named preset; ``fields`` (sizes or any other Config field) override it.

    Missing sizes default to GPT-2 small's (d_model 768, 12 layers, 12 heads, vocab 50257, n_ctx 1024).
    """
    if name not in PRESETS:
        from ..suggest import did_you_mean

        raise KeyError(f"unknown architecture preset {name!r}{did_you_mean(name, PRESETS)}; known: {', '.join(PRESETS)}")
    options = {**DEFAULT_SIZES, **PRESETS[name], "model_name": name, **fields}
    if name == "modern" and "d_mlp" not in fields:
        options["d_mlp"] = swiglu_width(options["d_model"])
    return Config(**options)
