"""Pure converters between ``transformers`` Qwen2 / Qwen2.5 and Qwen3 and glassbox, both ways.

Both families are Llama-shaped (pre-RMSNorm, "half" rotary over the whole head, SwiGLU, no MLP or
norm biases, grouped-query attention) and differ in the attention:
- Qwen2 (``model_type`` "qwen2", also Qwen2.5): q, k and v projections with biases, o without.
- Qwen3 (``model_type`` "qwen3"): RMSNorm over each head's d_head on queries and keys (one weight
  [d_head] each, shared by the heads; ``Config.qk_norm="head"``), applied after the projections and
  before the rotation, as transformers does; ``attention_bias`` puts biases on q, k, v and o alike;
  ``head_dim`` is independent of hidden_size / num_attention_heads.
Both may slide: ``layer_types`` (which transformers derives from ``use_sliding_window``,
``sliding_window`` and ``max_window_layers``: layers from index max_window_layers on slide) marks the
"sliding_attention" layers, which become ``attn_types`` "local" with ``window_size`` = sliding_window
(keys less than sliding_window sequence positions back, the query included). Rope scaling
(``rope_parameters`` "linear", "dynamic", "llama3", "yarn") maps onto ``Config.rope_scaling`` with
HF's names through positional.py's ``rope_scaling_from_hf`` / ``rope_parameters_for_hf`` (the
dynamic type's original length is max_position_embeddings, so n_ctx, a loaded model's position
limit, equals it); other rope types are refused by name.

HF stores nn.Linear weights as [d_out d_in]; ours right-multiply, so matrices are transposed and
split along head * d_head (HF's head order; kv heads in the order query head h reads h // groups).
Anything the config asks for that glassbox does not compute is refused, naming the field. Exporting
refuses a Config the family cannot represent: ``config_to`` converts back and compares every
architectural field, so a Config option that this module does not know (a later addition) cannot
be exported as a model that computes something else.
"""

import dataclasses
from typing import Mapping

from torch import Tensor

from ..models import Config
from ..models.config import ACT_FNS, ROPE_TYPES
from ..models.positional import rope_parameters_for_hf, rope_scaling_from_hf, scaled_context
from .family import Architecture
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from
from .llama_layout import decoder_shapes, decoder_to_glassbox, decoder_to_hf

QWEN_OPTIONS = dict(normalization="RMS", norm_placement="pre", positional="rotary", rotary_style="half",
                    gated_mlp=True, use_bias=False, unembed_bias=False, parallel_attn_mlp=False, mlp_bias=False)
# Config fields that do not change what the model computes (or only its precision: upcast_attn; n_ctx
# only limits a rotary model's positions, and the dynamic rope type's max_position_embeddings is its
# original length instead), so an export need not (and cannot) carry them. attn_scale is compared as
# the scale itself.
NOT_ARCHITECTURE = ("model_name", "init_range", "init_scheme", "default_prepend_bos", "n_ctx",
                    "ungroup_grouped_query_attention", "upcast_attn", "attn_scale")
# Tensors a checkpoint may hold that the architecture does not use: a tied lm_head (W_E again) and
# the rotary inverse frequencies that older checkpoints saved.
HF_IGNORED = (r"lm_head\.weight", r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# (HF name under model.layers.L., ours under blocks.L.) of each layer's two pre-norms.
NORMS = (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2"))


def _config_from(hf_config, model_type: str) -> Config:
    """A glassbox Config from a Qwen2Config / Qwen3Config (refusing options we do not compute)."""
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
    if getattr(hf_config, "model_type", None) != model_type:
        raise ValueError(f"expected a {family} config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    heads = hf_config.num_attention_heads
    if hf_config.hidden_act not in ACT_FNS:
        raise ValueError(f"{family} hidden_act {hf_config.hidden_act!r} is not supported (glassbox computes "
                         f"{', '.join(ACT_FNS)})")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default" and rope_type not in ROPE_TYPES:
        raise ValueError(f"{family} rope scaling {rope_type!r} (rope_parameters) is not supported (glassbox "
                         f"computes 'default', {', '.join(map(repr, ROPE_TYPES))})")
    try:  # a partial_rotary_factor is refused with scaling; the "default" type ignores it, as transformers' Qwen
        scaling = rope_scaling_from_hf(rope, hf_config.max_position_embeddings)
    except ValueError as err:
        raise ValueError(f"{family} {err}") from err
    attn_types, window = attn_types_from(hf_config, family, model_type)
    bias = bool(getattr(hf_config, "attention_bias", False)) if model_type == "qwen3" else None
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=heads,
        n_key_value_heads=hf_config.num_key_value_heads or heads,
        d_vocab=hf_config.vocab_size, n_ctx=scaled_context(hf_config.max_position_embeddings, scaling), d_head=head_dim,
        d_mlp=hf_config.intermediate_size, act_fn=hf_config.hidden_act, layer_norm_eps=hf_config.rms_norm_eps,
        init_range=hf_config.initializer_range, rotary_dim=head_dim,
        rotary_base=float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))), rope_scaling=scaling,
        qkv_bias=True if bias is None else bias, attn_out_bias=False if bias is None else bias,
        qk_norm="head" if model_type == "qwen3" else None, attn_types=attn_types, window_size=window,
        tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or model_type,
        **QWEN_OPTIONS,
    )


def config_from_qwen2(hf_config) -> Config:
    """A glassbox Config from a ``transformers.Qwen2Config`` (Qwen2, Qwen2.5)."""
    return _config_from(hf_config, "qwen2")


def config_from_qwen3(hf_config) -> Config:
    """A glassbox Config from a ``transformers.Qwen3Config``."""
    return _config_from(hf_config, "qwen3")


def _config_to(cfg: Config, model_type: str):
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[model_type]
    wanted = dict(QWEN_OPTIONS, qk_norm="head" if model_type == "qwen3" else None)
    if model_type == "qwen2":
        wanted.update(qkv_bias=True, attn_out_bias=False)
    wrong = {k: getattr(cfg, k) for k, v in wanted.items() if getattr(cfg, k) != v}
    if model_type == "qwen3" and cfg.qkv_bias != cfg.attn_out_bias:
        wrong.update(qkv_bias=cfg.qkv_bias, attn_out_bias=cfg.attn_out_bias)
    if cfg.positional == "rotary" and cfg.rotary_dim != cfg.d_head:
        wrong["rotary_dim"] = cfg.rotary_dim
    if cfg.layer_attn_scale(0) != cfg.d_head ** -0.5 or cfg.scale_attn_by_inverse_layer_idx:
        wrong["attn_scale"] = cfg.attn_scale
    if wrong:
        need = "q/k/v biases without an o bias" if model_type == "qwen2" else "per-head q/k norms, qkv_bias == attn_out_bias"
        raise ValueError(f"not a {family}-architecture config: {wrong} ({family} needs {wanted}, {need}, "
                         "rotary_dim == d_head and the 1/sqrt(d_head) attention scale)")
    local = [t == "local" for t in cfg.attn_types] if cfg.attn_types is not None else [False] * cfg.n_layers
    rope, max_positions = rope_parameters_for_hf(cfg.rope_scaling, cfg.rotary_base)
    extra = {"attention_bias": cfg.qkv_bias} if model_type == "qwen3" else {}
    rope["rope_theta"] = float(cfg.rotary_base)  # transformers' strict configs take floats only
    try:
        hf_config = _hf_config(cfg, family, rope, max_positions, local, extra)
    except Exception as err:  # transformers validates its configs itself, with its own error types
        raise ValueError(f"transformers' {family}Config refused this config ({type(err).__name__}: {err})") from err
    _check_represents(cfg, _config_from(hf_config, model_type), family)
    return hf_config


def _hf_config(cfg: Config, family: str, rope: dict, max_positions, local: list, extra: dict):
    import transformers

    return getattr(transformers, f"{family}Config")(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_key_value_heads, head_dim=cfg.d_head, vocab_size=cfg.d_vocab,
        max_position_embeddings=max_positions or cfg.n_ctx, intermediate_size=cfg.d_mlp, hidden_act=cfg.act_fn,
        rms_norm_eps=float(cfg.layer_norm_eps), initializer_range=float(cfg.init_range),
        tie_word_embeddings=cfg.tied_unembed,
        rope_parameters=rope,
        use_sliding_window=any(local), sliding_window=cfg.window_size if any(local) else None,
        max_window_layers=local.index(True) if any(local) else cfg.n_layers,
        layer_types=["sliding_attention" if slides else "full_attention" for slides in local],
        **extra,
    )


def _check_represents(cfg: Config, back: Config, family: str) -> None:
    """The HF config converts back to ``cfg`` in every field that changes the computation."""
    ours, theirs = _meaning(cfg), _meaning(back)
    differ = {name: ours[name] for name in ours if ours[name] != theirs[name]}
    if differ:
        raise ValueError(f"a {family} config cannot represent {differ} (transformers' {family} computes "
                         f"{ {k: getattr(back, k) for k in differ} } there)")


def _meaning(cfg: Config) -> dict:
    """The fields that change the computation, with equivalent spellings made equal (every layer
    global is no attn_types; a local rotary base without local layers is unused)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config) if f.name not in NOT_ARCHITECTURE}
    if "local" not in (cfg.attn_types or ()):
        fields.update(attn_types=None, rotary_base_local=None)
    return fields


def config_to_qwen2(cfg: Config):
    """A ``transformers.Qwen2Config`` for a Qwen2-architecture glassbox Config (ValueError otherwise)."""
    return _config_to(cfg, "qwen2")


def config_to_qwen3(cfg: Config):
    """A ``transformers.Qwen3Config`` for a Qwen3-architecture glassbox Config (ValueError otherwise)."""
    return _config_to(cfg, "qwen3")


def hf_expected_shapes(cfg: Config) -> dict:
    """HF's tensor names and shapes for a Qwen2 (qkv_bias, no attn_out_bias) or Qwen3 (qk_norm) config."""
    return decoder_shapes(cfg, NORMS)


def qwen_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "Qwen state dict") -> dict:
    """HF Qwen2ForCausalLM / Qwen3ForCausalLM state dict -> our state dict (pure: inputs unmodified).
    Every tensor's shape is checked, and a tensor the config does not describe is refused."""
    sd = hf_state_dict
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    check_no_extras(sd, expected, source, HF_IGNORED)
    return decoder_to_glassbox(sd, cfg, NORMS)


def glassbox_to_qwen(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF Qwen2ForCausalLM / Qwen3ForCausalLM state dict (contiguous tensors; the
    tied lm_head is W_E)."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    return decoder_to_hf(sd, cfg, NORMS)


# config.json field -> kind (checks.py), and the layer count / embedding layout checked against the weights.
_COMMON_FIELDS = {
    "num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size", "num_key_value_heads": "size?",
    "vocab_size": "size", "max_position_embeddings": "size", "intermediate_size": "size", "head_dim": "size?",
    "hidden_act": "str", "rms_norm_eps": "number", "initializer_range": "number>=0", "rope_theta": "number",
    "tie_word_embeddings": "bool", "rope_parameters": "object?", "rope_scaling": "object?",
    "use_sliding_window": "bool", "sliding_window": "size?", "max_window_layers": "count",
}
QWEN2_FIELDS = dict(_COMMON_FIELDS)
QWEN3_FIELDS = dict(_COMMON_FIELDS, attention_bias="bool")
WEIGHT_LAYOUT = ("num_hidden_layers", r"model\.layers\.(\d+)\.",
                 [(("model.embed_tokens.weight",), ("vocab_size", "hidden_size"))])

FAMILIES = [
    Architecture("qwen2", "Qwen2Config", "Qwen2ForCausalLM", config_from_qwen2, qwen_to_glassbox, config_to_qwen2,
                 glassbox_to_qwen, QWEN2_FIELDS, WEIGHT_LAYOUT),
    Architecture("qwen3", "Qwen3Config", "Qwen3ForCausalLM", config_from_qwen3, qwen_to_glassbox, config_to_qwen3,
                 glassbox_to_qwen, QWEN3_FIELDS, WEIGHT_LAYOUT),
]
