"""Pure converters between a ``transformers`` GPT-Neo (GPTNeoForCausalLM) and glassbox, both ways.

GPT-Neo (and the TinyStories models) is GPT-2's pre-LN block with separate q/k/v projections without
biases (imported as zero b_Q, b_K, b_V, as TransformerLens does, so that fold_ln has biases to fold the
norms' into; the export refuses nonzero ones), an output projection with one, an MLP of ``c_fc``/``c_proj`` (nn.Linear, [d_out d_in]),
learned positions and a tied unembedding without bias. Two things differ from GPT-2:
- the attention scores are not scaled: q.k, no 1/sqrt(d_head) (``attn_scale=1.0``), and transformers
  computes them and their softmax in float32 whatever the model's dtype (``upcast_attn=True``, which
  glassbox applies to half precision; in float64 transformers rounds the scores to float32 and
  glassbox does not);
- layers alternate global and local attention: ``attention_types`` ([[["global", "local"], 12]]),
  expanded by transformers into ``attention_layers``, one per layer (``Config.attn_types``; a
  config.json that saved ``attention_layers`` is read by that list, as transformers reads it); a local
  layer attends to the keys less than ``window_size`` positions back, itself included
  (``Config.window_size``, the same sliding window as Mistral's and Gemma's).

Positions are 0, 1, ... in transformers whatever the attention mask; glassbox counts real tokens
(``models/masks.py``), so a left-padded batch agrees with transformers given the same position_ids.
Refused, naming the field: an activation glassbox does not compute, a ``layer_types`` field (which
GPT-Neo does not read) that disagrees with attention_layers. Every tensor's shape is checked; the causal-mask buffers older checkpoints
saved are ignored.

Footgun: a GPT-Neo Config with no local layer is also a GPT-2 one (scale_attn_weights=False,
reorder_and_upcast_attn), so ``to_hf`` and ``save_pretrained`` write it as GPT2LMHeadModel, which
computes the same logits; ``glassbox_to_neo`` and ``config_to_neo`` write GPT-Neo's own layout.
"""

from typing import Mapping

import torch
from torch import Tensor

from ..models import Config
from ..models.activations import PARAMETRISED_ACTIVATIONS
from .family import Architecture, check_hf_activation, options_beyond
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import layer_types_of

NEO_SHAPE = dict(normalization="LN", norm_placement="pre", positional="learned", gated_mlp=False, use_bias=True,
                 unembed_bias=False, parallel_attn_mlp=False, attn_only=False, attn_scale=1.0, upcast_attn=True)
QKV_BIASES = ("b_Q", "b_K", "b_V")
NEO_CONFIG_FIELDS = {
    "num_layers": "size", "hidden_size": "size", "num_heads": "size", "vocab_size": "size",
    "max_position_embeddings": "size", "intermediate_size": "size?", "window_size": "size",
    "activation_function": "str", "layer_norm_epsilon": "number", "initializer_range": "number>=0",
    "tie_word_embeddings": "bool",
}  # attention_types (a JSON list) is checked by transformers' GPTNeoConfig, then by config_from_neo
NEO_WEIGHT_LAYOUT = ("num_layers", r"(?:transformer\.)?h\.(\d+)\.",
                     [(("transformer.wte.weight",), ("vocab_size", "hidden_size")),
                      (("transformer.wpe.weight",), ("max_position_embeddings", "hidden_size"))])
LAYER_NAMES = {"global": "full_attention", "local": "sliding_attention"}  # layer_types' names
# Causal and local-mask buffers that older checkpoints saved.
NEO_IGNORED = (r"transformer\.h\.\d+\.attn\.attention\.(masked_)?bias",)


def config_from_neo(hf_config) -> Config:
    """A glassbox Config from a ``transformers.GPTNeoConfig``."""
    if getattr(hf_config, "model_type", None) != "gpt_neo":
        raise ValueError(f"expected a GPT-Neo config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    act = hf_config.activation_function
    check_hf_activation(act, "GPT-Neo")
    layers = list(hf_config.attention_layers)
    if len(layers) != hf_config.num_layers or any(t not in ("global", "local") for t in layers):
        raise ValueError(f"GPT-Neo attention_types={hf_config.attention_types!r} gives {layers}: one of 'global', "
                         f"'local' for each of num_layers={hf_config.num_layers} layers is needed")
    types = layer_types_of(hf_config, "GPT-Neo")
    if types is not None and types != [LAYER_NAMES[t] for t in layers]:
        raise ValueError(f"GPT-Neo layer_types={types}: transformers' GPT-Neo model does not read layer_types (its "
                         f"layers are attention_layers={layers}); remove layer_types or make it agree")
    local = "local" in layers
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_layers, n_heads=hf_config.num_heads,
        d_vocab=hf_config.vocab_size, n_ctx=hf_config.max_position_embeddings,
        d_mlp=hf_config.intermediate_size or 4 * hf_config.hidden_size, act_fn=act,
        layer_norm_eps=hf_config.layer_norm_epsilon, init_range=hf_config.initializer_range,
        attn_types=tuple(layers) if local else None, window_size=hf_config.window_size if local else None,
        tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or "gpt_neo", **NEO_SHAPE,
    )


def config_to_neo(cfg: Config):
    """A ``transformers.GPTNeoConfig`` for a GPT-Neo-architecture glassbox Config (ValueError naming every
    option it cannot represent)."""
    from transformers import GPTNeoConfig

    wrong = {k: getattr(cfg, k) for k, v in NEO_SHAPE.items() if getattr(cfg, k) != v}
    wrong.update(options_beyond(cfg, allowed=tuple(NEO_SHAPE) + ("attn_types", "window_size")))
    for name in ("qkv_bias", "attn_out_bias", "mlp_bias"):
        if not getattr(cfg, name):
            wrong[name] = False
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        wrong["d_head"] = cfg.d_head
    if cfg.act_fn in PARAMETRISED_ACTIVATIONS:
        wrong["act_fn"] = cfg.act_fn
    if wrong:
        raise ValueError(f"not a GPT-Neo-architecture config: {wrong} (GPT-Neo needs {NEO_SHAPE}, "
                         "d_head * n_heads == d_model and no other family option)")
    types = list(cfg.attn_types or ("global",) * cfg.n_layers)
    last = cfg.d_vocab - 1
    return GPTNeoConfig(
        hidden_size=cfg.d_model, num_layers=cfg.n_layers, num_heads=cfg.n_heads, vocab_size=cfg.d_vocab,
        max_position_embeddings=cfg.n_ctx, intermediate_size=cfg.d_mlp, attention_types=[[types, 1]],
        window_size=cfg.window_size or 256, activation_function=cfg.act_fn, layer_norm_epsilon=cfg.layer_norm_eps,
        initializer_range=cfg.init_range, tie_word_embeddings=cfg.tied_unembed,
        bos_token_id=min(50256, last), eos_token_id=min(50256, last),
    )


# Per-layer tensors copied (or transposed) each way: (theirs under transformer.h.L., ours under blocks.L., transposed).
PLAIN_LAYER_TENSORS = (
    ("ln_1.weight", "ln1.w", False), ("ln_1.bias", "ln1.b", False),
    ("ln_2.weight", "ln2.w", False), ("ln_2.bias", "ln2.b", False),
    ("attn.attention.out_proj.bias", "attn.b_O", False),
    ("mlp.c_fc.weight", "mlp.W_in", True), ("mlp.c_fc.bias", "mlp.b_in", False),
    ("mlp.c_proj.weight", "mlp.W_out", True), ("mlp.c_proj.bias", "mlp.b_out", False),
)


def hf_expected_shapes(cfg: Config) -> dict:
    D, M, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"transformer.wte.weight": (V, D), "transformer.wpe.weight": (cfg.n_ctx, D),
              "transformer.ln_f.weight": (D,), "transformer.ln_f.bias": (D,)}
    for L in range(cfg.n_layers):
        h = f"transformer.h.{L}."
        shapes.update({
            h + "ln_1.weight": (D,), h + "ln_1.bias": (D,), h + "ln_2.weight": (D,), h + "ln_2.bias": (D,),
            h + "attn.attention.q_proj.weight": (D, D), h + "attn.attention.k_proj.weight": (D, D),
            h + "attn.attention.v_proj.weight": (D, D), h + "attn.attention.out_proj.weight": (D, D),
            h + "attn.attention.out_proj.bias": (D,),
            h + "mlp.c_fc.weight": (M, D), h + "mlp.c_fc.bias": (M,),
            h + "mlp.c_proj.weight": (D, M), h + "mlp.c_proj.bias": (D,),
        })
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def neo_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "GPT-Neo state dict") -> dict:
    """HF GPTNeoForCausalLM (or GPTNeoModel) state dict -> our state dict (pure: the inputs are not modified)."""
    sd = {k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k: v for k, v in hf_state_dict.items()}
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    check_no_extras(sd, expected, source, NEO_IGNORED + ((r"lm_head\.weight",) if cfg.tied_unembed else ()))
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    out = {"embed.W_E": sd["transformer.wte.weight"], "pos_embed.W_pos": sd["transformer.wpe.weight"],
           "ln_final.w": sd["transformer.ln_f.weight"], "ln_final.b": sd["transformer.ln_f.bias"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[p + f"attn.W_{name}"] = sd[h + f"attn.attention.{proj}_proj.weight"].reshape(H, Dh, D).transpose(1, 2)
            out[p + f"attn.b_{name}"] = sd[h + f"attn.attention.{proj}_proj.weight"].new_zeros(H, Dh)
        out[p + "attn.W_O"] = sd[h + "attn.attention.out_proj.weight"].T.reshape(H, Dh, D)
        out.update({p + ours: sd[h + theirs].T if transposed else sd[h + theirs]
                    for theirs, ours, transposed in PLAIN_LAYER_TENSORS})
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_neo(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF GPTNeoForCausalLM state dict (contiguous tensors). Refuses nonzero q/k/v
    biases, which GPT-Neo cannot represent."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    D = cfg.d_model
    for L in range(cfg.n_layers):
        for bias in QKV_BIASES:
            if torch.any(sd[f"blocks.{L}.attn.{bias}"] != 0):
                raise ValueError(f"blocks.{L}.attn.{bias} is nonzero; GPT-Neo's q/k/v projections have no biases "
                                 "to hold it")
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"],
           "transformer.ln_f.weight": sd["ln_final.w"], "transformer.ln_f.bias": sd["ln_final.b"]}
    for L in range(cfg.n_layers):
        h, p = f"transformer.h.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[h + f"attn.attention.{proj}_proj.weight"] = sd[p + f"attn.W_{name}"].transpose(1, 2).reshape(-1, D)
        out[h + "attn.attention.out_proj.weight"] = sd[p + "attn.W_O"].reshape(-1, D).T
        out.update({h + theirs: sd[p + ours].T if transposed else sd[p + ours]
                    for theirs, ours, transposed in PLAIN_LAYER_TENSORS})
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("gpt_neo", "GPTNeoConfig", "GPTNeoForCausalLM", config_from_neo, neo_to_glassbox,
                         config_to_neo, glassbox_to_neo, NEO_CONFIG_FIELDS, NEO_WEIGHT_LAYOUT,
                         tied_names=(("transformer.wte.weight",), ("lm_head.weight",)))]
