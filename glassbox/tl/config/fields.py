"""The fields of TransformerLens 3.9's HookedTransformerConfig, their defaults, and how glassbox treats each.

- ``ARCHITECTURE``: fields that shape the computation; mapped onto the glassbox Config (see
  ``hooked_transformer_config.to_glassbox``), fixed once a model is built.
- ``FLAGS``: the runtime hook flags, written through to ``model.hook_flags``.
- ``DESCRIPTIVE``: labels and loading options that change nothing computed; stored, settable.
- ``REFUSED``: options glassbox does not compute. Each maps to (allowed(value, values), reason): a
  value other than the default is refused unless ``allowed`` says it computes the same thing.
"""

import math

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
)

DESCRIPTIVE = (
    "model_name", "original_architecture", "tokenizer_name", "seed", "from_checkpoint", "checkpoint_index",
    "checkpoint_label_type", "checkpoint_value", "init_weights", "tokenizer_prepends_bos", "trust_remote_code",
    "uses_rms_norm", "layer_norm_folding", "ungroup_grouped_query_attention", "tie_word_embeddings",
    "decoder_start_token_id", "train_seq_length", "norm_topk_prob",
    # Parameters of options that stay off (refused when on): their values change nothing.
    "NTK_by_parts_low_freq_factor", "NTK_by_parts_high_freq_factor", "NTK_by_parts_factor", "NTK_original_ctx_len",
    "yarn_factor", "yarn_attention_factor", "yarn_beta_fast", "yarn_beta_slow",
    "yarn_original_max_position_embeddings", "yarn_truncate", "yarn_global_attn_only",
)

_never = lambda value, values: False  # noqa: E731

REFUSED = {
    "n_key_value_heads": (lambda value, values: value == values["n_heads"],
                          "glassbox has no grouped-query attention (n_key_value_heads must equal n_heads)"),
    "num_experts": (_never, "glassbox has no mixture-of-experts MLP"),
    "experts_per_token": (_never, "glassbox has no mixture-of-experts MLP"),
    "final_rms": (lambda value, values: values["normalization_type"] in ("RMS", "RMSPre"),
                  "glassbox's final norm is the blocks' kind (an RMSNorm after LayerNorm blocks is not built)"),
    "use_qk_norm": (_never, "glassbox has no query/key norm"),
    "clip_qkv": (_never, "glassbox does not clamp q, k and v"),
    "use_logn_attn": (_never, "glassbox has no log-n attention scaling"),
    "use_dynamic_ntk_rope": (_never, "glassbox's rotary base is fixed"),
    "use_NTK_by_parts_rope": (_never, "glassbox's rotary frequencies are not rescaled"),
    "use_yarn_rope": (_never, "glassbox's rotary frequencies are not rescaled"),
    "rotary_scaling_factor": (_never, "glassbox's rotary frequencies are not rescaled"),
    "rotary_base_local": (_never, "glassbox has no local attention layers"),
    "use_local_attn": (_never, "glassbox's attention is global and causal"),
    "window_size": (_never, "glassbox's attention is global and causal"),
    "attn_types": (_never, "glassbox's attention is global and causal"),
    "attention_dir": (_never, "glassbox's attention is causal"),
    "n_devices": (_never, "glassbox puts a model on one device"),
    "scale_attn_by_inverse_layer_idx": (_never, "glassbox scales scores by 1/sqrt(d_head) only"),
    "use_attn_scale": (_never, "glassbox scales scores by 1/sqrt(d_head)"),
    "attn_scale": (lambda value, values: values["use_attn_scale"] and math.isclose(value, math.sqrt(values["d_head"])),
                   "glassbox scales scores by 1/sqrt(d_head)"),
    "use_hook_tokens": (_never, "glassbox has no hook_tokens"),
    "post_embedding_ln": (_never, "glassbox has no norm after the embedding"),
    "load_in_4bit": (_never, "glassbox does not compute with quantized weights"),
    "quantization_method": (_never, "glassbox does not compute with quantized weights"),
    "relative_attention_max_distance": (_never, "glassbox has no relative attention bias"),
    "relative_attention_num_buckets": (_never, "glassbox has no relative attention bias"),
    "use_normalization_before_and_after": (_never, "glassbox has no norm after each sublayer"),
    "attn_scores_soft_cap": (_never, "glassbox does not soft-cap attention scores"),
    "output_logits_soft_cap": (_never, "glassbox does not soft-cap logits"),
    "use_attention_sinks": (_never, "glassbox has no attention sinks"),
}
