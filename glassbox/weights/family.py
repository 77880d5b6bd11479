"""``Architecture``: one Hugging Face architecture glassbox converts to and from.

Each family module (``gpt2.py``, ``llama.py``, ...) lists its entries in ``FAMILIES``;
``architectures.py`` collects them. An entry names the ``transformers`` config and model classes,
the four pure converter functions, and what ``checks.py`` verifies in a folder before building:
``config_fields`` (config.json field -> kind) and ``weight_layout`` (the layer-count field, a pattern
whose group is a layer index, and [(embedding tensor names, (config field of each axis))]).
"""

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hf_config_class: str  # a name in the transformers package
    hf_model_class: str
    config_from: Callable  # HF config -> Config
    to_glassbox: Callable  # (HF state dict, Config, source) -> our state dict
    config_to: Callable  # Config -> HF config (ValueError when it cannot represent it)
    to_hf: Callable  # (our state dict, Config) -> HF state dict
    config_fields: dict = field(default_factory=dict)
    weight_layout: Optional[tuple] = None


# The Config options of today's families, at the values that mean "GPT-2's behaviour". An exporter
# that does not map one refuses a config that sets it (``options_beyond``), rather than writing a
# Hugging Face config that computes something else.
FAMILY_OPTION_DEFAULTS = {
    "ungroup_grouped_query_attention": False, "attn_scale": None, "scale_attn_by_inverse_layer_idx": False,
    "upcast_attn": False, "qk_norm": None, "attn_scores_soft_cap": None, "output_logits_soft_cap": None,
    "attn_types": None, "window_size": None, "rotary_base_local": None, "rope_scaling": None,
    "norm_weight_offset": 0.0, "scale_embed": False, "parallel_ln2": False,
}


def options_beyond(cfg, allowed=()) -> dict:
    """The family options ``cfg`` sets (away from GPT-2's behaviour) that are not in ``allowed``:
    the FAMILY_OPTION_DEFAULTS fields, grouped-query attention (n_key_value_heads != n_heads) and
    per-part biases that differ from use_bias. ``ungroup_grouped_query_attention`` only changes hook
    shapes, so it never blocks an export."""
    found = {name: getattr(cfg, name) for name, default in FAMILY_OPTION_DEFAULTS.items()
             if name not in allowed and name != "ungroup_grouped_query_attention" and getattr(cfg, name) != default}
    if "n_key_value_heads" not in allowed and cfg.n_key_value_heads != cfg.n_heads:
        found["n_key_value_heads"] = cfg.n_key_value_heads
    for name in ("qkv_bias", "attn_out_bias", "mlp_bias"):
        if name not in allowed and getattr(cfg, name) != cfg.use_bias:
            found[name] = getattr(cfg, name)
    return found
