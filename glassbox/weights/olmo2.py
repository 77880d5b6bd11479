"""Pure converters between ``transformers`` OLMo 2 (Olmo2ForCausalLM) and glassbox, both ways.

OLMo 2 normalises the sublayers' outputs, not their inputs (``norm_placement="output"``):
resid_mid = resid_pre + ln1(attn(resid_pre)), resid_post = resid_mid + ln2(mlp(resid_mid)), where
ln1 is transformers' ``post_attention_layernorm`` and ln2 its ``post_feedforward_layernorm`` (both
RMSNorm; TransformerLens's names for OLMo 2), then a final RMSNorm. Queries and keys go through an
RMSNorm over all heads together before the rotation (``qk_norm="full"``: q_norm weight
[n_heads * d_head], k_norm [n_key_value_heads * d_head], with rms_norm_eps). Rotary "half" on every
head dim, grouped-query attention (``num_key_value_heads``), a SwiGLU MLP without biases, an untied
unembedding unless ``tie_word_embeddings``; ``attention_bias`` gives q/k/v and output biases.
``head_dim``, when the config sets one, is read (transformers' modules use it); d_head defaults to
hidden_size // num_attention_heads.

HF stores nn.Linear weights as [d_out d_in]; ours right-multiply, so matrices are transposed and the
per-head ones split along head * d_head. Rope scaling (``rope_parameters`` of rope_type "linear",
"dynamic", "llama3" or "yarn") maps onto ``Config.rope_scaling`` as for Llama (``llama.rope_from_hf``).
Refused by name: a hidden_act glassbox does not compute and any other rope_type. Every tensor's shape
is checked.
"""

from typing import Mapping

from torch import Tensor

from ..models import Config
from ..models.config import ACT_FNS
from ..models.positional import rope_parameters_for_hf, scaled_context
from .family import Architecture, options_beyond
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from
from .llama import rope_from_hf
from .llama_layout import decoder_shapes, decoder_to_glassbox, decoder_to_hf

OLMO2_OPTIONS = dict(normalization="RMS", norm_placement="output", qk_norm="full", positional="rotary",
                     rotary_style="half", gated_mlp=True, use_bias=False, mlp_bias=False, unembed_bias=False,
                     parallel_attn_mlp=False, attn_only=False)
OLMO2_ALLOWED = ("qk_norm", "n_key_value_heads", "qkv_bias", "attn_out_bias", "rope_scaling")

OLMO2_CONFIG_FIELDS = {
    "num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size",
    "num_key_value_heads": "size?", "head_dim": "size?", "vocab_size": "size", "max_position_embeddings": "size",
    "intermediate_size": "size", "hidden_act": "str", "rms_norm_eps": "number", "initializer_range": "number>=0",
    "rope_theta": "number", "tie_word_embeddings": "bool", "attention_bias": "bool", "rope_parameters": "object?",
    "rope_scaling": "object?",
}
OLMO2_WEIGHT_LAYOUT = ("num_hidden_layers", r"model\.layers\.(\d+)\.",
                       [(("model.embed_tokens.weight",), ("vocab_size", "hidden_size"))])


def config_from_olmo2(hf_config) -> Config:
    """A glassbox Config from a ``transformers.Olmo2Config`` (refusing what glassbox does not compute)."""
    if getattr(hf_config, "model_type", None) != "olmo2":
        raise ValueError(f"expected an OLMo 2 config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    act = hf_config.hidden_act
    if act not in ACT_FNS:
        raise ValueError(f"OLMo 2 hidden_act {act!r} is not supported (glassbox computes {', '.join(ACT_FNS)})")
    rotary_base, rope_scaling = rope_from_hf(hf_config, "OLMo 2")
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    attn_types_from(hf_config, "OLMo 2", "olmo2")  # its model never reads layer_types: checks the field
    bias = bool(hf_config.attention_bias)
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=heads,
        n_key_value_heads=hf_config.num_key_value_heads or heads, d_vocab=hf_config.vocab_size,
        n_ctx=scaled_context(hf_config.max_position_embeddings, rope_scaling), d_head=head_dim,
        d_mlp=hf_config.intermediate_size, act_fn=act,
        layer_norm_eps=hf_config.rms_norm_eps, init_range=hf_config.initializer_range, rotary_dim=head_dim,
        rotary_base=rotary_base, rope_scaling=rope_scaling,
        tied_unembed=bool(hf_config.tie_word_embeddings), qkv_bias=bias, attn_out_bias=bias,
        model_name=getattr(hf_config, "name_or_path", "") or "olmo2", **OLMO2_OPTIONS,
    )


def config_to_olmo2(cfg: Config):
    """A ``transformers.Olmo2Config`` for an OLMo-2-architecture glassbox Config (ValueError naming every
    option it cannot represent)."""
    from transformers import Olmo2Config

    wrong = {k: getattr(cfg, k) for k, v in OLMO2_OPTIONS.items() if getattr(cfg, k) != v}
    wrong.update(options_beyond(cfg, OLMO2_ALLOWED))
    if cfg.positional == "rotary" and cfg.rotary_dim != cfg.d_head:
        wrong["rotary_dim"] = cfg.rotary_dim
    if cfg.qkv_bias != cfg.attn_out_bias:
        wrong["qkv_bias != attn_out_bias"] = (cfg.qkv_bias, cfg.attn_out_bias)
    scaling = cfg.rope_scaling or {}
    if wrong:
        raise ValueError(f"not an OLMo-2-architecture config: {wrong} (OLMo 2 needs {OLMO2_OPTIONS}, "
                         "rotary_dim == d_head, one attention_bias for the q/k/v and output projections, and no "
                         f"family option beyond {OLMO2_ALLOWED})")
    last = cfg.d_vocab - 1
    rope, original = rope_parameters_for_hf(cfg.rope_scaling, cfg.rotary_base)  # dynamic: its original length
    extra = {"head_dim": cfg.d_head} if cfg.d_head * cfg.n_heads != cfg.d_model else {}
    return Olmo2Config(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_key_value_heads, vocab_size=cfg.d_vocab,
        max_position_embeddings=original or cfg.n_ctx,
        intermediate_size=cfg.d_mlp, hidden_act=cfg.act_fn, rms_norm_eps=cfg.layer_norm_eps,
        initializer_range=cfg.init_range, tie_word_embeddings=cfg.tied_unembed, attention_bias=cfg.qkv_bias,
        rope_parameters=rope, pad_token_id=min(1, last), bos_token_id=None, eos_token_id=last, **extra,
    )


# (HF name under model.layers.L., ours under blocks.L.) of the norms of the two sublayers' outputs.
NORMS = (("post_attention_layernorm", "ln1"), ("post_feedforward_layernorm", "ln2"))


def hf_expected_shapes(cfg: Config) -> dict:
    return decoder_shapes(cfg, NORMS)


def olmo2_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "OLMo 2 state dict") -> dict:
    """HF Olmo2ForCausalLM state dict -> our state dict (pure: the inputs are not modified)."""
    sd = hf_state_dict
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    # A tied model's lm_head is W_E again; older checkpoints saved rotary frequencies.
    ignored = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)
    ignored += (r"lm_head\.weight",) if cfg.tied_unembed else ()
    check_no_extras(sd, expected, source, ignored)
    return decoder_to_glassbox(sd, cfg, NORMS)


def glassbox_to_olmo2(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF Olmo2ForCausalLM state dict (contiguous tensors)."""
    check_shapes(state_dict, expected_shapes(cfg), "glassbox state dict")
    return decoder_to_hf(state_dict, cfg, NORMS)


FAMILIES = [Architecture("olmo2", "Olmo2Config", "Olmo2ForCausalLM", config_from_olmo2, olmo2_to_glassbox,
                         config_to_olmo2, glassbox_to_olmo2, OLMO2_CONFIG_FIELDS, OLMO2_WEIGHT_LAYOUT)]
