"""Pure converters between a ``transformers`` Llama (LlamaForCausalLM) and glassbox, both ways.

Llama is pre-RMSNorm, rotary with the "half" pairing on every head dim, a SwiGLU MLP and no biases.
HF stores nn.Linear weights as [d_out d_in]; ours right-multiply, so every matrix is transposed and
the per-head ones are split along head * d_head (HF's head order, already permuted for the "half"
rotation, so no reordering of dims is needed). Grouped-query attention (fewer key/value heads) and
rope scaling are refused rather than approximated. Every tensor's shape is checked.
"""

from typing import Mapping

from torch import Tensor

from ..models import Config
from .gpt2 import check_shapes, expected_shapes
from .checks import CONFIG_FIELDS, WEIGHT_LAYOUT
from .family import Architecture

LLAMA_OPTIONS = dict(normalization="RMS", norm_placement="pre", positional="rotary", rotary_style="half",
                     act_fn="silu", gated_mlp=True, use_bias=False, unembed_bias=False,
                     parallel_attn_mlp=False)


def config_from_llama(hf_config) -> Config:
    """A glassbox Config from a ``transformers.LlamaConfig`` (refusing options we do not compute)."""
    if getattr(hf_config, "model_type", None) != "llama":
        raise ValueError(f"expected a Llama config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    heads = hf_config.num_attention_heads
    if (hf_config.num_key_value_heads or heads) != heads:
        raise ValueError(f"grouped-query attention (num_key_value_heads={hf_config.num_key_value_heads} "
                         f"!= num_attention_heads={heads}) is not supported")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(hf_config, flag, False):
            raise ValueError(f"Llama configs with {flag}=True are not supported")
    if hf_config.hidden_act != "silu":
        raise ValueError(f"Llama hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type')!r} is not supported (only 'default')")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=heads,
        d_vocab=hf_config.vocab_size, n_ctx=hf_config.max_position_embeddings, d_head=head_dim,
        d_mlp=hf_config.intermediate_size, layer_norm_eps=hf_config.rms_norm_eps,
        init_range=hf_config.initializer_range, rotary_dim=head_dim,
        rotary_base=float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))),
        tied_unembed=bool(hf_config.tie_word_embeddings), model_name=getattr(hf_config, "name_or_path", "") or "llama",
        **LLAMA_OPTIONS,
    )


def config_to_llama(cfg: Config):
    """A ``transformers.LlamaConfig`` for a Llama-architecture glassbox Config."""
    from transformers import LlamaConfig

    wrong = {k: getattr(cfg, k) for k, v in LLAMA_OPTIONS.items() if getattr(cfg, k) != v}
    if cfg.positional == "rotary" and cfg.rotary_dim != cfg.d_head:
        wrong["rotary_dim"] = cfg.rotary_dim
    if wrong:
        raise ValueError(f"not a Llama-architecture config: {wrong} (Llama needs {LLAMA_OPTIONS} and "
                         "rotary_dim == d_head)")
    last = cfg.d_vocab - 1
    return LlamaConfig(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads, head_dim=cfg.d_head, vocab_size=cfg.d_vocab,
        max_position_embeddings=cfg.n_ctx, intermediate_size=cfg.d_mlp, rms_norm_eps=cfg.layer_norm_eps,
        initializer_range=cfg.init_range, tie_word_embeddings=cfg.tied_unembed,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rotary_base},
        bos_token_id=min(1, last), eos_token_id=min(2, last),
    )


def hf_expected_shapes(cfg: Config) -> dict:
    D, HDh, M, V = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp, cfg.d_vocab
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    for L in range(cfg.n_layers):
        h = f"model.layers.{L}."
        shapes.update({
            h + "input_layernorm.weight": (D,), h + "post_attention_layernorm.weight": (D,),
            h + "self_attn.q_proj.weight": (HDh, D), h + "self_attn.k_proj.weight": (HDh, D),
            h + "self_attn.v_proj.weight": (HDh, D), h + "self_attn.o_proj.weight": (D, HDh),
            h + "mlp.gate_proj.weight": (M, D), h + "mlp.up_proj.weight": (M, D), h + "mlp.down_proj.weight": (D, M),
        })
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def llama_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "Llama state dict") -> dict:
    """HF LlamaForCausalLM state dict -> our state dict (pure: the inputs are not modified)."""
    sd = hf_state_dict
    check_shapes(sd, hf_expected_shapes(cfg), source)
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    out = {"embed.W_E": sd["model.embed_tokens.weight"], "ln_final.w": sd["model.norm.weight"]}
    for L in range(cfg.n_layers):
        h, p = f"model.layers.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            # [head*d_head d_model] -> [head d_model d_head]
            out[p + f"attn.W_{name}"] = sd[h + f"self_attn.{proj}_proj.weight"].reshape(H, Dh, D).transpose(1, 2)
        out.update({
            p + "attn.W_O": sd[h + "self_attn.o_proj.weight"].T.reshape(H, Dh, D),
            p + "ln1.w": sd[h + "input_layernorm.weight"], p + "ln2.w": sd[h + "post_attention_layernorm.weight"],
            p + "mlp.W_gate": sd[h + "mlp.gate_proj.weight"].T, p + "mlp.W_in": sd[h + "mlp.up_proj.weight"].T,
            p + "mlp.W_out": sd[h + "mlp.down_proj.weight"].T,
        })
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_llama(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF LlamaForCausalLM state dict (contiguous tensors)."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    D = cfg.d_model
    out = {"model.embed_tokens.weight": sd["embed.W_E"], "model.norm.weight": sd["ln_final.w"]}
    for L in range(cfg.n_layers):
        h, p = f"model.layers.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[h + f"self_attn.{proj}_proj.weight"] = sd[p + f"attn.W_{name}"].transpose(1, 2).reshape(-1, D)
        out.update({
            h + "self_attn.o_proj.weight": sd[p + "attn.W_O"].reshape(-1, D).T,
            h + "input_layernorm.weight": sd[p + "ln1.w"], h + "post_attention_layernorm.weight": sd[p + "ln2.w"],
            h + "mlp.gate_proj.weight": sd[p + "mlp.W_gate"].T, h + "mlp.up_proj.weight": sd[p + "mlp.W_in"].T,
            h + "mlp.down_proj.weight": sd[p + "mlp.W_out"].T,
        })
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("llama", "LlamaConfig", "LlamaForCausalLM", config_from_llama, llama_to_glassbox, config_to_llama, glassbox_to_llama,
                         CONFIG_FIELDS["llama"], WEIGHT_LAYOUT["llama"])]
