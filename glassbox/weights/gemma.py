"""Pure converters between ``transformers`` Gemma 1, 2 and 3 and glassbox, both ways.

What the three compute, and the Config options each maps onto:
- All: RMSNorm times (1 + w), w kept as the checkpoint stores it (``norm_weight_offset=1.0``; the
  norm runs in float32 for half models, as in transformers); token embeddings times sqrt(d_model),
  the factor rounded to the model's dtype (``scale_embed``); GeGLU, the gate through the tanh
  GELU (``gated_mlp`` with act_fn "gelu_new"); a head_dim of its own; grouped- and multi-query
  attention; rotary "half" pairing over the whole head; tied or untied unembedding;
  ``attention_bias`` (q, k, v and o all biased) -> qkv_bias and attn_out_bias.
- Gemma 2 and 3: a norm before and after each sublayer (``norm_placement="sandwich"``:
  input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm
  are ln1, ln1_post, ln2, ln2_post); scores times query_pre_attn_scalar ** -0.5 (``attn_scale``);
  ``final_logit_softcapping`` -> output_logits_soft_cap; ``layer_types`` ("sliding_attention" /
  "full_attention") and ``sliding_window`` -> attn_types ("local" / "global") and window_size.
- Gemma 2: ``attn_logit_softcapping`` -> attn_scores_soft_cap. One rotary base (and scaling) for
  every layer.
- Gemma 3: q and k RMSNorm per head, also (1 + w) (``qk_norm="head"``); ``rope_parameters`` per
  layer type: "sliding_attention"'s rope_theta -> rotary_base_local, "full_attention"'s rope_theta
  and scaling -> rotary_base and rope_scaling (global layers only).

Gemma 3 image-text checkpoints (model_type "gemma3", Gemma3ForConditionalGeneration: the 4B-27B
releases) load as their text model: the language model's tensors under transformers 5's names or the
hub files' older ones, the vision tower and projector left out (an image token is then just a token).
Such a model exports as gemma3_text (Gemma3ForCausalLM).

Refused by name, never approximated: ``use_bidirectional_attention``; a Gemma 3 config that sets
``attn_logit_softcapping`` (transformers' Gemma 3 attention never applies it, so what such a
checkpoint means is ambiguous); rope scaling on Gemma 3's sliding layers; layer types other than
the two above; an activation glassbox does not compute.

Footguns: Gemma 1's activation is ``hidden_act`` as transformers 5 reads it (its config turns the
legacy "gelu" into the tanh approximation; a ``hidden_activation`` field is not read by its
model). transformers computes Gemma's norms and rotary angles in float32 even for a float64 model,
and rounds sqrt(d_model) to float32 when a float32 model is cast to float64; glassbox computes a
float64 model in float64 throughout.
"""

from typing import Mapping

from torch import Tensor

from ..models import Config
from ..models.positional import scaled_context
from .family import Architecture
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from
from .llama_layout import decoder_shapes, decoder_to_glassbox, decoder_to_hf

# The tanh-approximation names transformers uses for Gemma's activation; glassbox calls it gelu_new.
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_python_tanh", "gelu_accurate")

GEMMA_OPTIONS = dict(normalization="RMS", positional="rotary", rotary_style="half", gated_mlp=True,
                     use_bias=False, mlp_bias=False, unembed_bias=False, norm_weight_offset=1.0,
                     scale_embed=True, parallel_attn_mlp=False, parallel_ln2=False, attn_only=False,
                     scale_attn_by_inverse_layer_idx=False)
# model_type -> (norm placement, q/k norm) that tell the three apart.
SHAPE_OF = {"gemma": ("pre", None), "gemma2": ("sandwich", None), "gemma3_text": ("sandwich", "head")}
LAYER_TYPES = {"sliding_attention": "local", "full_attention": "global"}


def _act_fn(name, field: str) -> str:
    from ..models.config import ACT_FNS

    if name in TANH_GELU:
        return "gelu_new"
    if name in ACT_FNS:
        return name
    raise ValueError(f"Gemma {field}={name!r} is not an activation glassbox computes (it has {ACT_FNS})")


def _rope(params, max_positions: int) -> tuple:
    """(rope_theta, Config.rope_scaling or None) from one rope_parameters dict."""
    from ..models.positional import rope_scaling_from_hf

    params = dict(params or {})
    return float(params.get("rope_theta", 10000.0)), rope_scaling_from_hf(params, max_positions)


def config_from_gemma(hf_config) -> Config:
    """A glassbox Config from a transformers GemmaConfig, Gemma2Config or Gemma3TextConfig."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SHAPE_OF:
        raise ValueError(f"expected a Gemma config (model_type in {tuple(SHAPE_OF)}), got model_type={model_type!r}")
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise ValueError(f"{model_type} use_bidirectional_attention=True (non-causal attention) is not supported")
    placement, qk_norm = SHAPE_OF[model_type]
    act_field = "hidden_act" if model_type == "gemma" else "hidden_activation"
    heads, head_dim = hf_config.num_attention_heads, hf_config.head_dim
    options = dict(norm_placement=placement, qk_norm=qk_norm, act_fn=_act_fn(getattr(hf_config, act_field), act_field),
                   qkv_bias=bool(hf_config.attention_bias), attn_out_bias=bool(hf_config.attention_bias))
    rope = hf_config.rope_parameters or {}
    if model_type == "gemma3_text":
        if hf_config.attn_logit_softcapping is not None:
            raise ValueError(f"gemma3_text attn_logit_softcapping={hf_config.attn_logit_softcapping} is not supported: "
                             "transformers' Gemma 3 attention never applies it, so the checkpoint's intent is unclear")
        local_theta, local_scaling = _rope(rope.get("sliding_attention"), hf_config.max_position_embeddings)
        if local_scaling is not None:
            raise ValueError(f"gemma3_text rope scaling on the sliding_attention layers ({local_scaling}) is not "
                             "supported (glassbox's local layers rotate without scaling)")
        options["rotary_base"], options["rope_scaling"] = _rope(rope.get("full_attention"),
                                                                hf_config.max_position_embeddings)
        options["rotary_base_local"] = local_theta
    else:
        options["rotary_base"], options["rope_scaling"] = _rope(rope, hf_config.max_position_embeddings)
    if model_type != "gemma":
        options["attn_scale"] = float(hf_config.query_pre_attn_scalar) ** -0.5
        options["output_logits_soft_cap"] = hf_config.final_logit_softcapping
        if model_type == "gemma2":
            options["attn_scores_soft_cap"] = hf_config.attn_logit_softcapping
    types, window = attn_types_from(hf_config, model_type, model_type)  # Gemma 1: checks the field only
    if types is not None:
        options.update(attn_types=types, window_size=window)
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=heads,
        n_key_value_heads=hf_config.num_key_value_heads or heads, d_vocab=hf_config.vocab_size,
        n_ctx=scaled_context(hf_config.max_position_embeddings, options.get("rope_scaling")), d_head=head_dim,
        d_mlp=hf_config.intermediate_size, layer_norm_eps=hf_config.rms_norm_eps,
        init_range=hf_config.initializer_range, rotary_dim=head_dim,
        tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or model_type,
        **GEMMA_OPTIONS, **options,
    )


def _config_to(model_type: str):
    def config_to(cfg: Config):
        return config_to_gemma(cfg, model_type)
    config_to.__name__ = f"config_to_{model_type}"
    return config_to


def config_to_gemma(cfg: Config, model_type: str):
    """A transformers config of ``model_type`` for ``cfg``; ValueError naming what it cannot represent."""
    import transformers

    placement, qk_norm = SHAPE_OF[model_type]
    wanted = dict(GEMMA_OPTIONS, norm_placement=placement, qk_norm=qk_norm)
    wrong = {k: getattr(cfg, k) for k, v in wanted.items() if getattr(cfg, k) != v}
    if model_type == "gemma" and cfg.act_fn == "gelu":  # Gemma 1's config reads "gelu" as the tanh GELU
        wrong["act_fn"] = cfg.act_fn
    if cfg.positional == "rotary" and cfg.rotary_dim != cfg.d_head:
        wrong["rotary_dim"] = cfg.rotary_dim
    if cfg.qkv_bias != cfg.attn_out_bias:
        wrong["qkv_bias, attn_out_bias"] = (cfg.qkv_bias, cfg.attn_out_bias)
    if model_type == "gemma":
        for name in ("attn_scale", "attn_scores_soft_cap", "output_logits_soft_cap", "attn_types",
                     "rotary_base_local"):
            if getattr(cfg, name) is not None:
                wrong[name] = getattr(cfg, name)
    if model_type == "gemma2" and cfg.rotary_base_local is not None:
        wrong["rotary_base_local"] = cfg.rotary_base_local
    if model_type != "gemma" and cfg.d_model % cfg.n_heads:  # transformers' own check, made a ValueError
        wrong["d_model"] = f"{cfg.d_model} (transformers' {model_type} needs a multiple of n_heads={cfg.n_heads})"
    if model_type == "gemma3_text" and cfg.attn_scores_soft_cap is not None:
        wrong["attn_scores_soft_cap"] = cfg.attn_scores_soft_cap
    scalar = cfg.d_head if cfg.attn_scale is None else round(cfg.attn_scale ** -2)
    if cfg.attn_scale is not None and abs(scalar ** -0.5 - cfg.attn_scale) > 1e-12 * cfg.attn_scale:
        wrong["attn_scale"] = f"{cfg.attn_scale} (not query_pre_attn_scalar ** -0.5 for an integer scalar)"
    if wrong:
        raise ValueError(f"not a {model_type}-architecture config: {wrong} (it needs {wanted}, "
                         "rotary_dim == d_head and one bias flag for q, k, v and o)")
    act = "gelu_pytorch_tanh" if cfg.act_fn == "gelu_new" else cfg.act_fn
    last = cfg.d_vocab - 1
    common = dict(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_key_value_heads, head_dim=cfg.d_head, vocab_size=cfg.d_vocab,
        max_position_embeddings=cfg.n_ctx, intermediate_size=cfg.d_mlp, rms_norm_eps=float(cfg.layer_norm_eps),
        initializer_range=float(cfg.init_range), tie_word_embeddings=cfg.tied_unembed, attention_bias=cfg.qkv_bias,
        pad_token_id=0, eos_token_id=min(1, last), bos_token_id=min(2, last),
    )
    from ..models.positional import rope_parameters_for_hf

    rope, original = rope_parameters_for_hf(cfg.rope_scaling, cfg.rotary_base)
    if original is not None:  # the dynamic type scales past transformers' max_position_embeddings
        common["max_position_embeddings"] = original
    if model_type == "gemma":
        return transformers.GemmaConfig(**common, hidden_act=act, rope_parameters=rope)
    types = cfg.attn_types or ("global",) * cfg.n_layers
    later = dict(
        hidden_activation=act, query_pre_attn_scalar=scalar, final_logit_softcapping=_float(cfg.output_logits_soft_cap),
        layer_types=[{v: k for k, v in LAYER_TYPES.items()}[t] for t in types],
        sliding_window=cfg.window_size if cfg.window_size is not None else 4096,
    )
    if model_type == "gemma2":
        return transformers.Gemma2Config(**common, **later, rope_parameters=rope,
                                         attn_logit_softcapping=_float(cfg.attn_scores_soft_cap))
    local = cfg.rotary_base_local if cfg.rotary_base_local is not None else cfg.rotary_base
    return transformers.Gemma3TextConfig(
        **common, **later, attn_logit_softcapping=None,
        rope_parameters={"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": local}})


def _float(value):
    """transformers' strict configs refuse an int where a float is declared."""
    return None if value is None else float(value)


# (HF name under model.layers.L., ours under blocks.L.) of the norms; Gemma 1 has two, 2 and 3 four.
NORMS = {
    "gemma": (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2")),
    "sandwich": (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln1_post"),
                 ("pre_feedforward_layernorm", "ln2"), ("post_feedforward_layernorm", "ln2_post")),
}


def _norms(cfg: Config) -> tuple:
    return NORMS["gemma" if cfg.norm_placement == "pre" else "sandwich"]


def hf_expected_shapes(cfg: Config) -> dict:
    return decoder_shapes(cfg, _norms(cfg))


def gemma_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "Gemma state dict") -> dict:
    """HF Gemma/Gemma2/Gemma3 ForCausalLM state dict -> our state dict (pure: inputs not modified)."""
    sd = hf_state_dict
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    check_no_extras(sd, expected, source, ignored=(r"lm_head\.weight",) if cfg.tied_unembed else ())
    return decoder_to_glassbox(sd, cfg, _norms(cfg))


def glassbox_to_gemma(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF Gemma/Gemma2/Gemma3 ForCausalLM state dict (contiguous tensors)."""
    check_shapes(state_dict, expected_shapes(cfg), "glassbox state dict")
    return decoder_to_hf(state_dict, cfg, _norms(cfg))


# The text model's weights inside a Gemma 3 image-text checkpoint: transformers 5's own names, then
# the hub files' older ones; the vision tower and its projector are not glassbox's to compute.
MULTIMODAL_TEXT = ("model.language_model.", "language_model.model.")
MULTIMODAL_OTHER = r"(model\.)?(vision_tower|multi_modal_projector)\..*"


def config_from_gemma3_multimodal(hf_config) -> Config:
    """The text model of a transformers Gemma3Config (Gemma3ForConditionalGeneration): images are not
    glassbox's to compute, so the model built reads tokens only (an image token is just a token)."""
    if getattr(hf_config, "model_type", None) != "gemma3":
        raise ValueError(f"expected a Gemma 3 image-text config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    text = hf_config.text_config
    if getattr(text, "final_logit_softcapping", None) is not None:
        raise ValueError(f"Gemma 3 image-text config with text_config.final_logit_softcapping="
                         f"{text.final_logit_softcapping}: Gemma3ForConditionalGeneration never applies it (only "
                         "Gemma3ForCausalLM does), so what the checkpoint computes is unclear")
    # Gemma3ForConditionalGeneration ties by its own tie_word_embeddings, not text_config's
    return config_from_gemma(text).replace(tied_unembed=bool(hf_config.tie_word_embeddings))


def gemma3_multimodal_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config,
                                  source: str = "Gemma 3 image-text state dict") -> dict:
    """The text model's tensors of a Gemma3ForConditionalGeneration state dict -> our state dict; the
    vision tower and projector are left out, anything else unexpected is refused."""
    check_no_extras({k: v for k, v in hf_state_dict.items() if not k.startswith(MULTIMODAL_TEXT)}, {}, source,
                    ignored=(MULTIMODAL_OTHER, r"lm_head\.weight", r"language_model\.lm_head\.weight"))
    text = {}
    for key, value in hf_state_dict.items():
        prefix = next((p for p in MULTIMODAL_TEXT if key.startswith(p)), None)
        if prefix is not None:
            text["model." + key[len(prefix):]] = value
    for head in ("lm_head.weight", "language_model.lm_head.weight"):
        if head in hf_state_dict and not cfg.tied_unembed:
            text["lm_head.weight"] = hf_state_dict[head]
    return gemma_to_glassbox(text, cfg, source)


def config_to_gemma3_multimodal(cfg: Config):
    raise ValueError("glassbox holds only the text model of a Gemma 3 image-text checkpoint: it exports as "
                     "gemma3_text (Gemma3ForCausalLM)")


_SIZES = {"num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size",
          "num_key_value_heads": "size?", "vocab_size": "size", "max_position_embeddings": "size",
          "intermediate_size": "size", "head_dim": "size", "rms_norm_eps": "number",
          "initializer_range": "number>=0", "tie_word_embeddings": "bool", "attention_bias": "bool",
          "rope_parameters": "object?", "rope_scaling": "object?", "rope_theta": "number"}
_LATER = {"hidden_activation": "str", "query_pre_attn_scalar": "number", "sliding_window": "size?",
          "final_logit_softcapping": "number?", "attn_logit_softcapping": "number?"}
CONFIG_FIELDS = {"gemma": {**_SIZES, "hidden_act": "str"}, "gemma2": {**_SIZES, **_LATER},
                 "gemma3_text": {**_SIZES, **_LATER, "rope_local_base_freq": "number"}}
WEIGHT_LAYOUT = ("num_hidden_layers", r"model\.layers\.(\d+)\.",
                 [(("model.embed_tokens.weight",), ("vocab_size", "hidden_size"))])

FAMILIES = [
    Architecture(model_type, config_class, model_class, config_from_gemma, gemma_to_glassbox, _config_to(model_type),
                 glassbox_to_gemma, CONFIG_FIELDS[model_type], WEIGHT_LAYOUT)
    for model_type, config_class, model_class in (
        ("gemma", "GemmaConfig", "GemmaForCausalLM"), ("gemma2", "Gemma2Config", "Gemma2ForCausalLM"),
        ("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM"))
] + [Architecture("gemma3", "Gemma3Config", "Gemma3ForConditionalGeneration", config_from_gemma3_multimodal,
                  gemma3_multimodal_to_glassbox, config_to_gemma3_multimodal, glassbox_to_gemma,
                  {"text_config": CONFIG_FIELDS["gemma3_text"], "tie_word_embeddings": "bool"},
                  tied_names=(tuple(prefix + "embed_tokens.weight" for prefix in MULTIMODAL_TEXT),
                              ("lm_head.weight", "language_model.lm_head.weight")))]
