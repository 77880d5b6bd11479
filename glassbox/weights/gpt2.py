"""Pure converters between a ``transformers`` GPT-2 and glassbox, both ways.

HF GPT-2 stores its projections as Conv1D weights [d_in d_out] (x @ W + b) with Q, K and V fused in
``c_attn`` [d_model 3*d_model]; the head axis is the slow half of each d_model block. Our per-head
weights are views of those same columns, so the conversion is slicing and reshaping, nothing else.
Every tensor's shape is checked against the config, and a mismatch names the tensor.
"""

import re
from typing import Mapping

import torch
from torch import Tensor

from ..models import Config, HookedTransformer
from ..models.activations import ACTIVATIONS, PARAMETRISED_ACTIVATIONS
from .checks import CONFIG_FIELDS, WEIGHT_LAYOUT
from .family import Architecture, options_beyond
from .layer_types import attn_types_from

SUPPORTED_ACTIVATIONS = tuple(ACTIVATIONS)
# The GPT-2 options beyond GPT-2 small's that glassbox maps (the Stanford GPT-2 family sets the first).
GPT2_OPTIONS = ("scale_attn_by_inverse_layer_idx", "attn_scale", "upcast_attn")
# The Config values GPT-2's layout fixes.
GPT2_SHAPE = dict(normalization="LN", norm_placement="pre", positional="learned", gated_mlp=False, use_bias=True,
                  unembed_bias=False, parallel_attn_mlp=False)


def config_from_hf(hf_config) -> Config:
    """A glassbox Config from a ``transformers.GPT2Config`` (refusing options we do not compute).

    scale_attn_weights=False -> attn_scale=1.0 (raw q.k scores); scale_attn_by_inverse_layer_idx ->
    layer L's scores also / (L + 1); reorder_and_upcast_attn -> upcast_attn (scores and softmax in
    float32 for half-precision models; the same numbers as the plain path in float32 and float64).
    """
    if getattr(hf_config, "model_type", "gpt2") != "gpt2":
        raise ValueError(f"expected a GPT-2 config, got model_type={hf_config.model_type!r}")
    act = hf_config.activation_function
    if act in PARAMETRISED_ACTIVATIONS:
        raise ValueError(f"GPT-2 activation_function {act!r} has learned parameters of its own, which glassbox's "
                         "MLP does not hold")
    if act not in SUPPORTED_ACTIVATIONS:
        from ..suggest import did_you_mean

        raise ValueError(f"GPT-2 activation_function {act!r} is not one of {SUPPORTED_ACTIVATIONS}"
                         + did_you_mean(act, SUPPORTED_ACTIVATIONS))
    attn_types_from(hf_config, "GPT-2", "gpt2")  # its model never reads layer_types: checks the field
    return Config(
        attn_scale=None if getattr(hf_config, "scale_attn_weights", True) else 1.0,
        scale_attn_by_inverse_layer_idx=bool(getattr(hf_config, "scale_attn_by_inverse_layer_idx", False)),
        upcast_attn=bool(getattr(hf_config, "reorder_and_upcast_attn", False)),
        d_model=hf_config.n_embd,
        n_layers=hf_config.n_layer,
        n_heads=hf_config.n_head,
        d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.n_positions,
        d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
        act_fn=act,
        layer_norm_eps=hf_config.layer_norm_epsilon,
        init_range=hf_config.initializer_range,
        tied_unembed=bool(getattr(hf_config, "tie_word_embeddings", True)),
        model_name=getattr(hf_config, "name_or_path", "") or "gpt2",
    )


def config_to_hf(cfg: Config):
    """A ``transformers.GPT2Config`` for a GPT-2-architecture glassbox Config."""
    from transformers import GPT2Config

    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise ValueError(f"HF GPT-2 needs d_head * n_heads == d_model, got {cfg.d_head} * {cfg.n_heads} "
                         f"!= {cfg.d_model}")
    wrong = {k: getattr(cfg, k) for k, v in GPT2_SHAPE.items() if getattr(cfg, k) != v}
    if wrong:
        raise ValueError(f"not a GPT-2-architecture config: {wrong} (GPT-2 needs {GPT2_SHAPE}: pre-LayerNorm, "
                         "learned positions, biases, no gate, and an lm_head without a bias)")
    beyond = options_beyond(cfg, allowed=GPT2_OPTIONS)
    if cfg.attn_scale not in (None, 1.0):
        beyond["attn_scale"] = cfg.attn_scale
    if beyond:
        raise ValueError(f"GPT-2 cannot represent {beyond} (it has scale_attn_weights, "
                         "scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn only)")
    if cfg.act_fn in PARAMETRISED_ACTIVATIONS:
        raise ValueError(f"activation {cfg.act_fn!r} is not computed by glassbox")
    return GPT2Config(
        scale_attn_weights=cfg.attn_scale is None, scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx,
        reorder_and_upcast_attn=cfg.upcast_attn,
        n_embd=cfg.d_model, n_layer=cfg.n_layers, n_head=cfg.n_heads, vocab_size=cfg.d_vocab,
        n_positions=cfg.n_ctx, n_inner=cfg.d_mlp, activation_function=cfg.act_fn,
        layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tied_unembed, bos_token_id=min(50256, cfg.d_vocab - 1),
        eos_token_id=min(50256, cfg.d_vocab - 1),
    )


def expected_shapes(cfg: Config) -> dict:
    """Our state-dict keys and their shapes for ``cfg``, read off the model itself (built on the meta
    device, so nothing is allocated): one source of truth for every architecture's converter."""
    model = HookedTransformer(cfg, init=False, device="meta")
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def hf_expected_shapes(cfg: Config) -> dict:
    D, M, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"transformer.wte.weight": (V, D), "transformer.wpe.weight": (cfg.n_ctx, D),
              "transformer.ln_f.weight": (D,), "transformer.ln_f.bias": (D,)}
    for L in range(cfg.n_layers):
        p = f"transformer.h.{L}."
        shapes.update({
            p + "ln_1.weight": (D,), p + "ln_1.bias": (D,), p + "ln_2.weight": (D,), p + "ln_2.bias": (D,),
            p + "attn.c_attn.weight": (D, 3 * D), p + "attn.c_attn.bias": (3 * D,),
            p + "attn.c_proj.weight": (D, D), p + "attn.c_proj.bias": (D,),
            p + "mlp.c_fc.weight": (D, M), p + "mlp.c_fc.bias": (M,),
            p + "mlp.c_proj.weight": (M, D), p + "mlp.c_proj.bias": (D,),
        })
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def check_shapes(state_dict: Mapping[str, Tensor], expected: dict, source: str = "state dict") -> None:
    """Every expected key present with its shape; errors name the tensor (and the source)."""
    missing = [k for k in expected if k not in state_dict]
    if missing:
        raise ValueError(f"{source} is missing {len(missing)} tensor(s), e.g. {missing[:3]}")
    for key, shape in expected.items():
        got = tuple(state_dict[key].shape)
        if got != tuple(shape):
            raise ValueError(f"{source}: tensor {key} has shape {got}, expected {tuple(shape)}")
        if not state_dict[key].is_floating_point():  # loading would cast it silently
            raise ValueError(f"{source}: tensor {key} has dtype {state_dict[key].dtype}, expected floating point")


def check_no_extras(state_dict: Mapping[str, Tensor], expected: dict, source: str, ignored=()) -> None:
    """No tensor beyond ``expected`` (and the ``ignored`` patterns): an extra layer, an extra head or
    another architecture's weights mean the file is not the model the config describes."""
    extra = [k for k in state_dict if k not in expected and not any(re.fullmatch(p, k) for p in ignored)]
    if extra:
        raise ValueError(f"{source} has {len(extra)} tensor(s) that its config does not describe, e.g. "
                         f"{extra[:3]}: weights of another size or architecture?")


# Causal-mask buffers that older GPT-2 checkpoints saved; the tied lm_head is W_E again.
HF_IGNORED = (r"transformer\.h\.\d+\.attn\.(masked_)?bias", r"lm_head\.weight")


def hf_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "HF state dict") -> dict:
    """HF GPT2LMHeadModel (or GPT2Model) state dict -> our state dict. Pure; shares no memory rules."""
    sd = {k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v
          for k, v in hf_state_dict.items()}
    check_shapes(sd, hf_expected_shapes(cfg), source)
    check_no_extras(sd, hf_expected_shapes(cfg), source, HF_IGNORED)
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    out = {"embed.W_E": sd["transformer.wte.weight"], "pos_embed.W_pos": sd["transformer.wpe.weight"],
           "ln_final.w": sd["transformer.ln_f.weight"], "ln_final.b": sd["transformer.ln_f.bias"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        W_qkv, b_qkv = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]
        for i, name in enumerate("QKV"):
            out[p + f"attn.W_{name}"] = W_qkv[:, i * D:(i + 1) * D].reshape(D, H, Dh).permute(1, 0, 2)
            out[p + f"attn.b_{name}"] = b_qkv[i * D:(i + 1) * D].reshape(H, Dh)
        out.update({
            p + "attn.W_O": sd[h + "attn.c_proj.weight"].reshape(H, Dh, D),
            p + "attn.b_O": sd[h + "attn.c_proj.bias"],
            p + "ln1.w": sd[h + "ln_1.weight"], p + "ln1.b": sd[h + "ln_1.bias"],
            p + "ln2.w": sd[h + "ln_2.weight"], p + "ln2.b": sd[h + "ln_2.bias"],
            p + "mlp.W_in": sd[h + "mlp.c_fc.weight"], p + "mlp.b_in": sd[h + "mlp.c_fc.bias"],
            p + "mlp.W_out": sd[h + "mlp.c_proj.weight"], p + "mlp.b_out": sd[h + "mlp.c_proj.bias"],
        })
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_hf(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF GPT2LMHeadModel state dict (contiguous tensors)."""
    check_shapes(state_dict, expected_shapes(cfg), "glassbox state dict")
    sd, D = state_dict, cfg.d_model
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"],
           "transformer.ln_f.weight": sd["ln_final.w"], "transformer.ln_f.bias": sd["ln_final.b"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        out[h + "attn.c_attn.weight"] = torch.cat(
            [sd[p + f"attn.W_{n}"].permute(1, 0, 2).reshape(D, -1) for n in "QKV"], dim=1)
        out[h + "attn.c_attn.bias"] = torch.cat([sd[p + f"attn.b_{n}"].reshape(-1) for n in "QKV"])
        out.update({
            h + "attn.c_proj.weight": sd[p + "attn.W_O"].reshape(-1, D),
            h + "attn.c_proj.bias": sd[p + "attn.b_O"],
            h + "ln_1.weight": sd[p + "ln1.w"], h + "ln_1.bias": sd[p + "ln1.b"],
            h + "ln_2.weight": sd[p + "ln2.w"], h + "ln_2.bias": sd[p + "ln2.b"],
            h + "mlp.c_fc.weight": sd[p + "mlp.W_in"], h + "mlp.c_fc.bias": sd[p + "mlp.b_in"],
            h + "mlp.c_proj.weight": sd[p + "mlp.W_out"], h + "mlp.c_proj.bias": sd[p + "mlp.b_out"],
        })
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("gpt2", "GPT2Config", "GPT2LMHeadModel", config_from_hf, hf_to_glassbox, config_to_hf, glassbox_to_hf,
                         CONFIG_FIELDS["gpt2"], WEIGHT_LAYOUT["gpt2"],
                         tied_names=(("transformer.wte.weight", "wte.weight"), ("lm_head.weight",)))]
