"""Pure converters between a ``transformers`` GPT-J (GPTJForCausalLM) and glassbox, both ways.

GPT-J is a parallel block (attention and MLP both read ln_1 of the same residual stream), rotary
with the "interleaved" pairing on the first ``rotary_dim`` dims of each head (base 10000, fixed
in HF's code), a GELU MLP with biases, LayerNorm with biases, attention without biases and an
unembedding with a bias. Our config has one ``use_bias`` switch, so a GPT-J model here has attention
biases that the import sets to zero; the export refuses a model whose attention biases are not
zero (GPT-J has nowhere to put them). HF stores nn.Linear weights as [d_out d_in]; ours
right-multiply. Every tensor's shape is checked.
"""

from typing import Mapping

import torch
from torch import Tensor

from ..models import Config
from ..models.activations import ACTIVATIONS
from .gpt2 import check_shapes, expected_shapes
from .checks import CONFIG_FIELDS, WEIGHT_LAYOUT
from .family import Architecture, options_beyond
from .layer_types import attn_types_from

GPTJ_OPTIONS = dict(normalization="LN", norm_placement="pre", parallel_attn_mlp=True, positional="rotary",
                    rotary_style="interleaved", rotary_base=10000.0, gated_mlp=False, use_bias=True,
                    unembed_bias=True)
ATTN_BIASES = ("b_Q", "b_K", "b_V", "b_O")


def config_from_gptj(hf_config) -> Config:
    """A glassbox Config from a ``transformers.GPTJConfig``."""
    if getattr(hf_config, "model_type", None) != "gptj":
        raise ValueError(f"expected a GPT-J config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    act = hf_config.activation_function
    if act not in ACTIVATIONS:
        from ..suggest import did_you_mean

        raise ValueError(f"GPT-J activation_function {act!r} is not supported (glassbox computes "
                         f"{', '.join(ACTIVATIONS)}){did_you_mean(act, ACTIVATIONS)}")
    attn_types_from(hf_config, "GPT-J", "gptj")  # its model never reads layer_types: checks the field
    d_head = hf_config.n_embd // hf_config.n_head
    return Config(
        d_model=hf_config.n_embd, n_layers=hf_config.n_layer, n_heads=hf_config.n_head,
        d_vocab=hf_config.vocab_size, n_ctx=hf_config.n_positions, d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
        act_fn=act, layer_norm_eps=hf_config.layer_norm_epsilon, init_range=hf_config.initializer_range,
        rotary_dim=hf_config.rotary_dim or d_head, tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or "gptj", **GPTJ_OPTIONS,
    )


def config_to_gptj(cfg: Config):
    """A ``transformers.GPTJConfig`` for a GPT-J-architecture glassbox Config."""
    from transformers import GPTJConfig

    wrong = {k: getattr(cfg, k) for k, v in GPTJ_OPTIONS.items() if getattr(cfg, k) != v}
    wrong.update(options_beyond(cfg))
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        wrong["d_head"] = cfg.d_head
    if wrong:
        raise ValueError(f"not a GPT-J-architecture config: {wrong} (GPT-J needs {GPTJ_OPTIONS} and "
                         "d_head * n_heads == d_model)")
    last = cfg.d_vocab - 1
    return GPTJConfig(
        n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, vocab_size=cfg.d_vocab,
        n_positions=cfg.n_ctx, n_inner=cfg.d_mlp, rotary_dim=cfg.rotary_dim, activation_function=cfg.act_fn,
        layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tied_unembed, bos_token_id=min(50256, last), eos_token_id=min(50256, last),
    )


def hf_expected_shapes(cfg: Config) -> dict:
    D, M, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"transformer.wte.weight": (V, D), "transformer.ln_f.weight": (D,), "transformer.ln_f.bias": (D,),
              "lm_head.bias": (V,)}
    for L in range(cfg.n_layers):
        h = f"transformer.h.{L}."
        shapes.update({
            h + "ln_1.weight": (D,), h + "ln_1.bias": (D,),
            h + "attn.q_proj.weight": (D, D), h + "attn.k_proj.weight": (D, D), h + "attn.v_proj.weight": (D, D),
            h + "attn.out_proj.weight": (D, D),
            h + "mlp.fc_in.weight": (M, D), h + "mlp.fc_in.bias": (M,),
            h + "mlp.fc_out.weight": (D, M), h + "mlp.fc_out.bias": (D,),
        })
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def gptj_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "GPT-J state dict") -> dict:
    """HF GPTJForCausalLM state dict -> our state dict (pure: the inputs are not modified)."""
    sd = hf_state_dict
    check_shapes(sd, hf_expected_shapes(cfg), source)
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    W_E = sd["transformer.wte.weight"]
    out = {"embed.W_E": W_E, "ln_final.w": sd["transformer.ln_f.weight"], "ln_final.b": sd["transformer.ln_f.bias"],
           "unembed.b_U": sd["lm_head.bias"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[p + f"attn.W_{name}"] = sd[h + f"attn.{proj}_proj.weight"].reshape(H, Dh, D).transpose(1, 2)
            out[p + f"attn.b_{name}"] = W_E.new_zeros(H, Dh)
        out.update({
            p + "attn.W_O": sd[h + "attn.out_proj.weight"].T.reshape(H, Dh, D), p + "attn.b_O": W_E.new_zeros(D),
            p + "ln1.w": sd[h + "ln_1.weight"], p + "ln1.b": sd[h + "ln_1.bias"],
            p + "mlp.W_in": sd[h + "mlp.fc_in.weight"].T, p + "mlp.b_in": sd[h + "mlp.fc_in.bias"],
            p + "mlp.W_out": sd[h + "mlp.fc_out.weight"].T, p + "mlp.b_out": sd[h + "mlp.fc_out.bias"],
        })
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_gptj(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF GPTJForCausalLM state dict (contiguous tensors).

    Refuses nonzero attention biases, which GPT-J cannot represent.
    """
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    D = cfg.d_model
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.ln_f.weight": sd["ln_final.w"],
           "transformer.ln_f.bias": sd["ln_final.b"], "lm_head.bias": sd["unembed.b_U"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        for bias in ATTN_BIASES:
            if torch.any(sd[p + "attn." + bias] != 0):
                raise ValueError(f"{p}attn.{bias} is nonzero; GPT-J's attention has no biases to hold it")
        for name, proj in zip("QKV", "qkv"):
            out[h + f"attn.{proj}_proj.weight"] = sd[p + f"attn.W_{name}"].transpose(1, 2).reshape(-1, D)
        out.update({
            h + "attn.out_proj.weight": sd[p + "attn.W_O"].reshape(-1, D).T,
            h + "ln_1.weight": sd[p + "ln1.w"], h + "ln_1.bias": sd[p + "ln1.b"],
            h + "mlp.fc_in.weight": sd[p + "mlp.W_in"].T, h + "mlp.fc_in.bias": sd[p + "mlp.b_in"],
            h + "mlp.fc_out.weight": sd[p + "mlp.W_out"].T, h + "mlp.fc_out.bias": sd[p + "mlp.b_out"],
        })
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("gptj", "GPTJConfig", "GPTJForCausalLM", config_from_gptj, gptj_to_glassbox, config_to_gptj, glassbox_to_gptj,
                         CONFIG_FIELDS["gptj"], WEIGHT_LAYOUT["gptj"],
                         tied_names=(("transformer.wte.weight",), ("lm_head.weight",)))]
