"""Pure converters between ``transformers`` Llama 2/3 and Mistral (LlamaForCausalLM,
MistralForCausalLM) and glassbox, both ways.

Both are pre-RMSNorm, rotary with the "half" pairing on every head dim, a gated MLP (SwiGLU with
hidden_act "silu") and one state-dict layout. HF stores nn.Linear weights as [d_out d_in]; ours
right-multiply, so every matrix is transposed and the per-head ones are split along head * d_head
(HF's head order, already permuted for the "half" rotation, so no reordering of dims is needed).
Every tensor's shape is checked.

What is mapped (HF -> Config):
- num_key_value_heads -> n_key_value_heads (grouped- and multi-query attention: k_proj and v_proj
  are [kv_head * d_head, d_model]; query head h reads kv head h // groups, as HF's repeat_kv).
- rope_parameters (transformers 5.x): rope_theta -> rotary_base; for rope_type "linear", "dynamic",
  "llama3" or "yarn" every other key goes into Config.rope_scaling unchanged, except: an old "type"
  key equal to rope_type is dropped, and the dynamic type's original_max_position_embeddings is set
  to max_position_embeddings (transformers' dynamic scaling reads that, not the dict). Any other
  rope_type is refused by name, and so is a partial_rotary_factor other than 1 with scaling (HF's
  Llama then builds tables narrower than its heads; without scaling it ignores the factor).
- Llama's attention_bias (q, k, v and o projections) -> qkv_bias and attn_out_bias; mlp_bias (gate,
  up and down) -> mlp_bias. Mistral has neither (its projections never have biases, whatever its
  config says).
- hidden_act: any activation glassbox computes under that name (models/activations).
- tie_word_embeddings -> tied_unembed, unless the checkpoint's lm_head.weight differs from the embedding
  (transformers then keeps both: ``family.resolve_tying``).
- Mistral's sliding_window: None, or every layer local with window_size = sliding_window (keys less
  than sliding_window positions back, the query's own included), in a forward pass and in cached
  generation alike, as MistralForCausalLM does. A Mistral config.json with layer_types is Ministral's
  (transformers' AutoConfig reads it so): its "sliding_attention" layers are local, the others global
  (``layer_types.py`` has the one rule for every family). LlamaForCausalLM ignores sliding_window in a forward
  pass, but its generation cache keeps only that many keys, so a Llama config whose sliding_window is
  below max_position_embeddings is refused (the two disagree); at or above it, it never acts.

Export (``config_to_llama`` / ``config_to_mistral``) writes all of it back and refuses, with the
option named, any Config either cannot represent: a windowed config is Mistral's (a Llama export
refuses it), biases are Llama's only, and a mix of local and global layers exports as Ministral.
"""

from typing import Mapping

from torch import Tensor

from ..models import Config
from ..models.positional import rope_parameters_for_hf, scaled_context
from ..models.config import ACT_FNS, ROPE_TYPES
from .checks import CONFIG_FIELDS, WEIGHT_LAYOUT
from .family import Architecture, options_beyond
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from
from .llama_layout import MLP_NAMES, decoder_shapes, decoder_to_glassbox, decoder_to_hf  # noqa: F401 (MLP_NAMES: kept)

# act_fn is Llama's default; a config's hidden_act replaces it (any activation glassbox computes).
LLAMA_OPTIONS = dict(normalization="RMS", norm_placement="pre", positional="rotary", rotary_style="half",
                     act_fn="silu", gated_mlp=True, use_bias=False, unembed_bias=False, parallel_attn_mlp=False)
# The family options (family.options_beyond) these exporters map; any other set one is refused.
MAPPED_OPTIONS = ("n_key_value_heads", "qkv_bias", "attn_out_bias", "mlp_bias", "attn_scale", "rope_scaling",
                  "attn_types", "window_size")
FAMILY_NAMES = {"llama": "Llama", "mistral": "Mistral", "ministral": "Ministral"}


def config_from_llama(hf_config) -> Config:
    """A glassbox Config from a ``transformers.LlamaConfig``, ``MistralConfig`` or ``MinistralConfig``
    (refusing, by name, options we do not compute; layer_types read by ``layer_types.attn_types_from``)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in FAMILY_NAMES:
        raise ValueError(f"expected a Llama or Mistral config, got model_type={model_type!r}")
    family = FAMILY_NAMES[model_type]
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise ValueError(f"{family} num_key_value_heads={kv_heads} does not divide num_attention_heads={heads}")
    if hf_config.hidden_act not in ACT_FNS:
        raise ValueError(f"{family} hidden_act {hf_config.hidden_act!r} is not supported (glassbox computes "
                         f"{', '.join(ACT_FNS)})")
    rotary_base, rope_scaling = rope_from_hf(hf_config, family)
    if model_type != "llama":
        attn_bias = mlp_bias = False  # Mistral's and Ministral's projections are built with bias=False
        window = getattr(hf_config, "sliding_window", None)
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"{family} sliding_window={window!r} must be None or a positive integer")
        attn_types, window = attn_types_from(hf_config, family, model_type, windowed=window is not None)
    else:
        attn_bias = bool(getattr(hf_config, "attention_bias", False))
        mlp_bias = bool(getattr(hf_config, "mlp_bias", False))
        window = getattr(hf_config, "sliding_window", None)
        if window is not None and window < hf_config.max_position_embeddings:
            raise ValueError(f"Llama config with sliding_window={window} (< max_position_embeddings="
                             f"{hf_config.max_position_embeddings}) is not supported: LlamaForCausalLM attends to "
                             "every position in a forward pass but its generation cache keeps only the last "
                             "sliding_window keys, so transformers itself computes two different models (a "
                             "windowed model is Mistral's: model_type='mistral')")
        attn_types, window = attn_types_from(hf_config, family, model_type)  # never windowed: checks the field
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    n_ctx = scaled_context(hf_config.max_position_embeddings, rope_scaling)  # dynamic: factor times longer
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=heads,
        n_key_value_heads=kv_heads, d_vocab=hf_config.vocab_size, n_ctx=n_ctx,
        d_head=head_dim, d_mlp=hf_config.intermediate_size,
        layer_norm_eps=hf_config.rms_norm_eps, init_range=hf_config.initializer_range, rotary_dim=head_dim,
        rotary_base=rotary_base, rope_scaling=rope_scaling, qkv_bias=attn_bias, attn_out_bias=attn_bias,
        mlp_bias=mlp_bias, attn_types=attn_types, window_size=window, tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or model_type,
        **{**LLAMA_OPTIONS, "act_fn": hf_config.hidden_act},
    )


def rope_from_hf(hf_config, family: str) -> tuple:
    """(rotary_base, rope_scaling) from the config's rope_parameters (or a pre-5.x rope_theta)."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    base = float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
    if rope_type == "default":
        return base, None
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"{family} rope_parameters rope_type={rope_type!r} is not supported (glassbox computes "
                         f"'default', {', '.join(map(repr, ROPE_TYPES))})")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{family} rope_parameters partial_rotary_factor={rope['partial_rotary_factor']} with "
                         f"rope_type={rope_type!r} is not supported: transformers' {family} rotates every dim "
                         "of a head and its scaled tables would not fit them")
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if scaling.get("type") == rope_type:
        del scaling["type"]  # the old name of rope_type
    if rope_type == "dynamic":  # transformers' dynamic type scales from max_position_embeddings, whatever the dict says
        scaling["original_max_position_embeddings"] = hf_config.max_position_embeddings
    return base, scaling


def unrepresentable(cfg: Config, family: str) -> dict:
    """The Config values ``family`` ("llama" or "mistral") cannot represent (empty when it can)."""
    wrong = {k: getattr(cfg, k) for k, v in LLAMA_OPTIONS.items() if k != "act_fn" and getattr(cfg, k) != v}
    wrong.update(options_beyond(cfg, allowed=MAPPED_OPTIONS))
    if cfg.rotary_dim != cfg.d_head:
        wrong["rotary_dim"] = cfg.rotary_dim
    if cfg.attn_scale is not None and cfg.attn_scale != cfg.d_head ** -0.5:
        wrong["attn_scale"] = cfg.attn_scale  # both scale q.k by 1/sqrt(head_dim)
    if cfg.act_fn not in ACT_FNS:
        wrong["act_fn"] = cfg.act_fn
    if family == "llama":
        if cfg.qkv_bias != cfg.attn_out_bias:  # one attention_bias flag for q, k, v and o
            wrong.update(qkv_bias=cfg.qkv_bias, attn_out_bias=cfg.attn_out_bias)
        if cfg.attn_types is not None and "local" in cfg.attn_types:
            wrong.update(attn_types=cfg.attn_types, window_size=cfg.window_size)
    else:
        wrong.update({k: True for k in ("qkv_bias", "attn_out_bias", "mlp_bias") if getattr(cfg, k)})
        if family == "mistral" and cfg.attn_types is not None and len(set(cfg.attn_types)) > 1:
            wrong["attn_types"] = cfg.attn_types  # one sliding_window for every layer, or none: Ministral's
    return wrong


def _config_to(cfg: Config, family: str, needs: str):
    import transformers

    wrong = unrepresentable(cfg, family)
    if wrong:
        raise ValueError(f"not a {FAMILY_NAMES[family]}-architecture config: {wrong} ({FAMILY_NAMES[family]} "
                         f"needs {LLAMA_OPTIONS} (act_fn any glassbox computes), rotary_dim == d_head, the "
                         f"1/sqrt(d_head) score scale, no family option beyond {MAPPED_OPTIONS}, and {needs})")
    last = cfg.d_vocab - 1
    # the dynamic type's original length is transformers' max_position_embeddings, not a dict key
    rope, original = rope_parameters_for_hf(cfg.rope_scaling, cfg.rotary_base)
    fields = dict(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_key_value_heads, head_dim=cfg.d_head, vocab_size=cfg.d_vocab,
        max_position_embeddings=original or cfg.n_ctx, intermediate_size=cfg.d_mlp, hidden_act=cfg.act_fn,
        rms_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.init_range, tie_word_embeddings=cfg.tied_unembed,
        rope_parameters=rope, bos_token_id=min(1, last), eos_token_id=min(2, last),
    )
    if family == "llama":
        return transformers.LlamaConfig(**fields, attention_bias=cfg.qkv_bias, mlp_bias=cfg.mlp_bias)
    local = cfg.attn_types is not None and cfg.attn_types[0] == "local"
    if family == "ministral":
        types = cfg.attn_types or ("global",) * cfg.n_layers
        return transformers.MinistralConfig(**fields, sliding_window=cfg.window_size,
                                            layer_types=[{"local": "sliding_attention", "global": "full_attention"}[t]
                                                         for t in types])
    return transformers.MistralConfig(**fields, sliding_window=cfg.window_size if local else None)


def config_to_llama(cfg: Config):
    """A ``transformers.LlamaConfig`` for a Llama-architecture glassbox Config (ValueError naming what
    Llama cannot represent otherwise)."""
    return _config_to(cfg, "llama", "qkv_bias == attn_out_bias (one attention_bias) and no local layers "
                                    "(a sliding window is Mistral's)")


def config_to_ministral(cfg: Config):
    """A ``transformers.MinistralConfig`` (Mistral with per-layer windows) for a Mistral-architecture Config
    whose layers mix local and global (a uniform one exports as Mistral, which comes first)."""
    return _config_to(cfg, "ministral", "no biases")


def config_to_mistral(cfg: Config):
    """A ``transformers.MistralConfig`` for a Mistral-architecture glassbox Config: sliding_window from
    window_size when every layer is local, else None."""
    return _config_to(cfg, "mistral", "no biases, and every layer local (sliding_window) or every layer global")


# (HF name under model.layers.L., ours under blocks.L.) of each layer's two pre-norms.
NORMS = (("input_layernorm", "ln1"), ("post_attention_layernorm", "ln2"))


def hf_expected_shapes(cfg: Config) -> dict:
    return decoder_shapes(cfg, NORMS)


# Rotary frequencies that older checkpoints saved as buffers (recomputed from the config).
HF_IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq")


def llama_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "Llama state dict") -> dict:
    """HF LlamaForCausalLM / MistralForCausalLM state dict -> our state dict (pure: the inputs are not
    modified). A tied model's lm_head.weight, if present, is not read; any other tensor the config
    does not describe (a bias the config has no flag for, an extra layer) is refused by name."""
    sd = hf_state_dict
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    check_no_extras(sd, expected, source, HF_IGNORED + ((r"lm_head\.weight",) if cfg.tied_unembed else ()))
    return decoder_to_glassbox(sd, cfg, NORMS)


def glassbox_to_llama(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF LlamaForCausalLM / MistralForCausalLM state dict (contiguous tensors)."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    return decoder_to_hf(sd, cfg, NORMS)


FAMILIES = [
    Architecture("llama", "LlamaConfig", "LlamaForCausalLM", config_from_llama, llama_to_glassbox, config_to_llama,
                 glassbox_to_llama, CONFIG_FIELDS["llama"], WEIGHT_LAYOUT["llama"]),
    Architecture("mistral", "MistralConfig", "MistralForCausalLM", config_from_llama, llama_to_glassbox,
                 config_to_mistral, glassbox_to_llama, CONFIG_FIELDS["mistral"], WEIGHT_LAYOUT["mistral"]),
    Architecture("ministral", "MinistralConfig", "MinistralForCausalLM", config_from_llama, llama_to_glassbox,
                 config_to_ministral, glassbox_to_llama, CONFIG_FIELDS["mistral"], WEIGHT_LAYOUT["mistral"]),
]
