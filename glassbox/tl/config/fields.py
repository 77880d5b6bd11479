"""The fields of TransformerLens 3.9's HookedTransformerConfig, their defaults, and how glassbox treats each.

- ``ARCHITECTURE``: fields that shape the computation; mapped onto the glassbox Config (see
  ``hooked_transformer_config.to_glassbox``), fixed once a model is built.
- ``FLAGS``: the runtime hook flags, written through to ``model.hook_flags``.
- ``DESCRIPTIVE``: labels and loading options that change nothing computed; stored, settable.
- ``REFUSED``: options glassbox does not compute, or computes only in some combinations. Each maps to
  (allowed(value, values), reason): a value other than the default is refused unless ``allowed`` says
  glassbox computes the same thing.

Today's families map onto glassbox options of the same meaning (``family_options``, here):
grouped-query heads, per-head q/k norms, inverse-layer scaling, the score scale (TransformerLens
divides by ``attn_scale``, glassbox multiplies by its inverse), soft caps (TransformerLens's -1.0 is glassbox's None), local layers and their rotary base, the norms after each
sublayer ("sandwich"), OLMo 2/3's output norms and q/k norms over all heads (TransformerLens keys them on
``original_architecture``), and linear, NTK-by-parts (llama3) and YaRN rope scaling. TransformerLens's
Gemma norms store 1 + w, so glassbox builds them with no weight offset.
"""

from typing import Any, Dict

import numpy as np
import torch

REQUIRED = object()

TL_DEFAULTS = {
    "d_model": REQUIRED, "d_head": REQUIRED, "n_layers": REQUIRED, "n_ctx": REQUIRED,
    "n_heads": -1, "d_mlp": None, "d_vocab": -1, "device": None,
    "use_attn_result": False, "use_split_qkv_input": False, "default_prepend_bos": True,
    "positional_embedding_type": "standard", "n_key_value_heads": None, "attn_only": False, "gated_mlp": False,
    "uses_rms_norm": False, "eps": 1e-5, "layer_norm_folding": False, "act_fn": "relu", "normalization_type": "LN",
    "num_experts": None, "experts_per_token": None, "final_rms": False, "dtype": torch.float32, "model_name": "custom",
    "use_attn_scale": True, "attn_scale": -1.0, "use_hook_mlp_in": False, "use_attn_in": False, "use_qk_norm": False,
    "clip_qkv": None, "use_logn_attn": False, "train_seq_length": None, "use_dynamic_ntk_rope": False,
    "use_local_attn": False, "ungroup_grouped_query_attention": False, "original_architecture": None,
    "from_checkpoint": False, "checkpoint_index": None, "checkpoint_label_type": None, "checkpoint_value": None,
    "tokenizer_name": None, "window_size": None, "attn_types": None, "init_mode": "gpt2", "n_devices": 1,
    "attention_dir": "causal", "seed": None, "initializer_range": -1.0, "init_weights": True,
    "scale_attn_by_inverse_layer_idx": False, "d_vocab_out": -1, "parallel_attn_mlp": False, "rotary_dim": None,
    "n_params": None, "use_hook_tokens": False, "tokenizer_prepends_bos": None, "post_embedding_ln": False,
    "rotary_base": 10000, "rotary_base_local": None, "rotary_scaling_factor": 1.0, "trust_remote_code": False,
    "rotary_adjacent_pairs": False, "load_in_4bit": False, "quantization_method": None,
    "relative_attention_max_distance": None, "relative_attention_num_buckets": None, "decoder_start_token_id": None,
    "tie_word_embeddings": False, "use_normalization_before_and_after": False, "attn_scores_soft_cap": -1.0,
    "output_logits_soft_cap": -1.0, "use_NTK_by_parts_rope": False, "NTK_by_parts_low_freq_factor": 1.0,
    "NTK_by_parts_high_freq_factor": 4.0, "NTK_by_parts_factor": 8.0, "NTK_original_ctx_len": 8192,
    "use_yarn_rope": False, "yarn_factor": 1.0, "yarn_attention_factor": 1.0, "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0, "yarn_original_max_position_embeddings": 4096, "yarn_truncate": True,
    "yarn_global_attn_only": False, "use_attention_sinks": False, "norm_topk_prob": False,
}

FLAGS = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")

ARCHITECTURE = (
    "d_model", "d_head", "n_layers", "n_ctx", "n_heads", "d_mlp", "d_vocab", "d_vocab_out", "act_fn", "eps",
    "normalization_type", "positional_embedding_type", "rotary_dim", "rotary_base", "rotary_adjacent_pairs",
    "parallel_attn_mlp", "gated_mlp", "attn_only", "initializer_range", "init_mode", "use_attn_scale",
    "attn_scale", "n_params",
    # today's families (see hooked_transformer_config.family_options)
    "n_key_value_heads", "ungroup_grouped_query_attention", "use_qk_norm", "scale_attn_by_inverse_layer_idx",
    "attn_scores_soft_cap", "output_logits_soft_cap", "use_local_attn", "window_size", "attn_types",
    "rotary_base_local", "use_normalization_before_and_after", "rotary_scaling_factor", "use_NTK_by_parts_rope",
    "NTK_by_parts_low_freq_factor", "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "NTK_original_ctx_len",
    "use_yarn_rope", "yarn_factor", "yarn_attention_factor", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_original_max_position_embeddings", "yarn_truncate", "yarn_global_attn_only",
)

DESCRIPTIVE = (
    "model_name", "original_architecture", "tokenizer_name", "seed", "from_checkpoint", "checkpoint_index",
    "checkpoint_label_type", "checkpoint_value", "init_weights", "tokenizer_prepends_bos", "trust_remote_code",
    "uses_rms_norm", "layer_norm_folding", "tie_word_embeddings", "decoder_start_token_id", "train_seq_length",
    "norm_topk_prob",
)

# TransformerLens 3.9 builds OLMo's output norms (ln1/ln2 after each sublayer) for these, and q/k norms
# over all heads together (not per head) for these.
POST_NORM_ARCHITECTURES = ("Olmo2ForCausalLM", "Olmo3ForCausalLM")
FULL_QK_NORM_ARCHITECTURES = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")

_never = lambda value, values: False  # noqa: E731
_rms = lambda values: values["normalization_type"] in ("RMS", "RMSPre")  # noqa: E731
_rotary = lambda values: values["positional_embedding_type"] == "rotary"  # noqa: E731
_n_scalings = lambda values: (bool(values["use_NTK_by_parts_rope"]) + bool(values["use_yarn_rope"])  # noqa: E731
                              + (values["rotary_scaling_factor"] != 1.0))

REFUSED = {
    "n_key_value_heads": (lambda value, values: isinstance(value, int) and not isinstance(value, bool) and value > 0
                          and values["n_heads"] % value == 0,
                          "grouped-query attention needs a positive n_key_value_heads dividing n_heads"),
    "num_experts": (_never, "glassbox has no mixture-of-experts MLP"),
    "experts_per_token": (_never, "glassbox has no mixture-of-experts MLP"),
    "final_rms": (lambda value, values: values["normalization_type"] in ("RMS", "RMSPre"),
                  "glassbox's final norm is the blocks' kind (an RMSNorm after LayerNorm blocks is not built)"),
    "use_qk_norm": (lambda value, values: _rms(values) and values["original_architecture"]
                    not in FULL_QK_NORM_ARCHITECTURES,
                    "glassbox's per-head q/k RMSNorm needs RMS blocks (normalization_type 'RMS' or 'RMSPre'), and "
                    "not on top of OLMo's q/k norms over all heads"),
    "clip_qkv": (_never, "glassbox does not clamp q, k and v"),
    "use_logn_attn": (_never, "glassbox has no log-n attention scaling"),
    "use_dynamic_ntk_rope": (_never, "glassbox's dynamic rope scaling is transformers' ('dynamic'), not Qwen-1's "
                                     "log-n NTK alpha"),
    "use_local_attn": (lambda value, values: isinstance(values["window_size"], int) and values["window_size"] > 0
                       and values["attn_types"] is not None and len(values["attn_types"]) == values["n_layers"]
                       and all(t in ("global", "local") for t in values["attn_types"]),
                       "local attention needs window_size (a positive int) and attn_types ('global' or 'local' for "
                       "each of the n_layers layers)"),
    "use_NTK_by_parts_rope": (lambda value, values: _rotary(values) and _n_scalings(values) == 1,
                              "NTK-by-parts (llama3) rope scaling needs rotary positions and no other rope scaling"),
    "use_yarn_rope": (lambda value, values: _rotary(values) and _n_scalings(values) == 1,
                      "YaRN rope scaling needs rotary positions and no other rope scaling"),
    "rotary_scaling_factor": (lambda value, values: _rotary(values) and _n_scalings(values) == 1 and value >= 1,
                              "linear rope scaling needs rotary positions, no other rope scaling and a factor >= 1"),
    "attention_dir": (_never, "glassbox's attention is causal"),
    "n_devices": (_never, "glassbox puts a model on one device"),
    "use_hook_tokens": (_never, "glassbox has no hook_tokens"),
    "post_embedding_ln": (_never, "glassbox has no norm after the embedding"),
    "load_in_4bit": (_never, "glassbox does not compute with quantized weights"),
    "quantization_method": (_never, "glassbox does not compute with quantized weights"),
    "relative_attention_max_distance": (_never, "glassbox has no relative attention bias"),
    "relative_attention_num_buckets": (_never, "glassbox has no relative attention bias"),
    "use_normalization_before_and_after": (lambda value, values: _rms(values) and values["original_architecture"]
                                           not in POST_NORM_ARCHITECTURES,
                                           "TransformerLens builds its norms after each sublayer as RMSNorm only "
                                           "(normalization_type 'RMS' or 'RMSPre'), and not with OLMo's output norms"),
    "use_attention_sinks": (_never, "glassbox has no attention sinks"),
}


def scales_local_layers(values: Dict[str, Any]) -> bool:
    """Whether TransformerLens's rope scaling applies to local layers too (linear scaling never does)."""
    return bool(values["use_NTK_by_parts_rope"]) or (bool(values["use_yarn_rope"]) and not values["yarn_global_attn_only"])


def rope_scaling(values: Dict[str, Any]):
    """glassbox's rope_scaling dict (transformers' names) for TransformerLens's rope options, or None."""
    if values["positional_embedding_type"] != "rotary":
        return None
    if values["use_NTK_by_parts_rope"]:  # Llama 3.1's: transformers' "llama3"
        return {"rope_type": "llama3", "factor": float(values["NTK_by_parts_factor"]),
                "low_freq_factor": float(values["NTK_by_parts_low_freq_factor"]),
                "high_freq_factor": float(values["NTK_by_parts_high_freq_factor"]),
                "original_max_position_embeddings": int(values["NTK_original_ctx_len"])}
    if values["use_yarn_rope"]:  # TransformerLens's YaRN is transformers' with an explicit attention factor
        return {"rope_type": "yarn", "factor": float(values["yarn_factor"]),
                "original_max_position_embeddings": int(values["yarn_original_max_position_embeddings"]),
                "attention_factor": float(values["yarn_attention_factor"]),
                "beta_fast": float(values["yarn_beta_fast"]), "beta_slow": float(values["yarn_beta_slow"]),
                "truncate": bool(values["yarn_truncate"])}
    if values["rotary_scaling_factor"] != 1.0:  # frequencies divided by the factor on global layers
        return {"rope_type": "linear", "factor": float(values["rotary_scaling_factor"])}
    return None


def family_options(values: Dict[str, Any]) -> Dict[str, Any]:
    """The glassbox Config options of today's families for TransformerLens's fields (checked already)."""
    out: Dict[str, Any] = {}
    if values["n_key_value_heads"] is not None:
        out["n_key_value_heads"] = values["n_key_value_heads"]
    out["ungroup_grouped_query_attention"] = bool(values["ungroup_grouped_query_attention"])
    # TransformerLens divides the scores by attn_scale (sqrt(d_head) by default, 1 without use_attn_scale);
    # glassbox multiplies them by its attn_scale (None: d_head ** -0.5).
    divisor = values["attn_scale"] if values["use_attn_scale"] else 1.0
    if not (values["use_attn_scale"] and divisor == np.sqrt(values["d_head"])):
        out["attn_scale"] = 1.0 / float(divisor)
    out["scale_attn_by_inverse_layer_idx"] = bool(values["scale_attn_by_inverse_layer_idx"])
    for name in ("attn_scores_soft_cap", "output_logits_soft_cap"):  # TransformerLens: <= 0 or None is off
        cap = values[name]
        out[name] = float(cap) if cap is not None and cap > 0 else None
    local = bool(values["use_local_attn"]) and "local" in values["attn_types"]
    if values["use_local_attn"]:  # TransformerLens reads attn_types and window_size only then
        out["attn_types"] = tuple(values["attn_types"])
        if local:
            out["window_size"] = values["window_size"]
    rotary = values["positional_embedding_type"] == "rotary"
    scaling = rope_scaling(values)
    out["rope_scaling"] = scaling
    if rotary and local:  # TransformerLens uses rotary_base_local on local layers only
        base = values["rotary_base_local"]
        if scaling is not None and not scales_local_layers(values) and base is None:
            base = values["rotary_base"]  # glassbox leaves local layers unscaled only with a base of their own
        if scaling is not None and scales_local_layers(values):
            base = None  # checked: TransformerLens's local base is rotary_base here
        out["rotary_base_local"] = None if base is None else float(base)
    architecture = values["original_architecture"]
    if values["use_normalization_before_and_after"]:
        out["norm_placement"] = "sandwich"
    if architecture in POST_NORM_ARCHITECTURES:
        out["norm_placement"] = "output"
    if architecture in FULL_QK_NORM_ARCHITECTURES:
        out["qk_norm"] = "full"
    elif values["use_qk_norm"]:
        out["qk_norm"] = "head"
    if values["parallel_attn_mlp"]:  # TransformerLens's parallel MLP reads its own ln2 (GPT-NeoX's block)
        out["parallel_ln2"] = True
    return out


def family_fields(cfg) -> Dict[str, Any]:
    """TransformerLens's fields for the options of today's families (the inverse of ``family_options``
    where TransformerLens can say it; views of the rest are as close as its fields allow)."""
    out: Dict[str, Any] = {}
    if cfg.n_key_value_heads != cfg.n_heads:
        out["n_key_value_heads"] = cfg.n_key_value_heads
    out["ungroup_grouped_query_attention"] = cfg.ungroup_grouped_query_attention
    if cfg.attn_scale == 1.0:  # unscaled scores (GPT-Neo): TransformerLens's use_attn_scale=False
        out["use_attn_scale"] = False
    elif cfg.attn_scale is not None:  # else derive() gives TransformerLens's sqrt(d_head)
        out["attn_scale"] = 1.0 / cfg.attn_scale
    out["scale_attn_by_inverse_layer_idx"] = cfg.scale_attn_by_inverse_layer_idx
    for name in ("attn_scores_soft_cap", "output_logits_soft_cap"):
        out[name] = -1.0 if getattr(cfg, name) is None else getattr(cfg, name)
    if cfg.attn_types is not None and "local" in cfg.attn_types:  # all-global layers need no field
        out.update(use_local_attn=True, attn_types=list(cfg.attn_types), window_size=cfg.window_size)
    out["rotary_base_local"] = cfg.rotary_base_local
    out["use_normalization_before_and_after"] = cfg.norm_placement == "sandwich"
    if cfg.norm_placement == "output" and cfg.qk_norm == "full":
        out["original_architecture"] = "Olmo2ForCausalLM"
    out["use_qk_norm"] = cfg.qk_norm == "head"
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type") == "linear":
        out["rotary_scaling_factor"] = scaling["factor"]
    elif scaling.get("rope_type") == "llama3":
        out.update(use_NTK_by_parts_rope=True, NTK_by_parts_factor=scaling["factor"],
                   NTK_by_parts_low_freq_factor=scaling["low_freq_factor"],
                   NTK_by_parts_high_freq_factor=scaling["high_freq_factor"],
                   NTK_original_ctx_len=scaling["original_max_position_embeddings"])
    elif scaling.get("rope_type") == "yarn":  # the factor on cos and sin as transformers resolves it
        from ...models.positional import yarn_attention_factor

        out.update(use_yarn_rope=True, yarn_factor=scaling["factor"], yarn_attention_factor=yarn_attention_factor(scaling),
                   yarn_original_max_position_embeddings=scaling["original_max_position_embeddings"],
                   yarn_beta_fast=scaling.get("beta_fast", 32.0), yarn_beta_slow=scaling.get("beta_slow", 1.0),
                   yarn_truncate=scaling.get("truncate", True),
                   yarn_global_attn_only=cfg.rotary_base_local is not None)
    return out
