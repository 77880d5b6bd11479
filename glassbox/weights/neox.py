"""Pure converters between ``transformers`` GPT-NeoX / Pythia (GPTNeoXForCausalLM) and glassbox, both ways.

GPT-NeoX is pre-LayerNorm (with biases), rotary with the "half" pairing on the first
``rotary_dim = int(d_head * partial_rotary_factor)`` dims of each head (the config's ``rotary_pct``,
0.25 in Pythia), a non-gated MLP with biases and an untied unembedding without bias (``embed_out``).
With ``use_parallel_residual`` (Pythia, NeoX-20B) a layer is parallel with two norms:
resid_post = resid_pre + attn(ln1(resid_pre)) + mlp(ln2(resid_pre)) (``parallel_attn_mlp`` and
``parallel_ln2``); without it, the sequential pre-norm block. ``attention_bias`` switches the biases
of the fused projection and of the output projection (``qkv_bias``, ``attn_out_bias``); the MLP and
the norms always have theirs.

The fused ``query_key_value`` weight [3 * d_model, d_model] is laid out per head: rows
h * 3 * d_head + [0, d_head) are head h's query, the next d_head its key, the next its value
(transformers views the output as [.., head, 3 * d_head] and chunks the last axis); the bias likewise.

Rope scaling (``rope_parameters`` of rope_type "linear", "dynamic", "llama3" or "yarn") maps onto
``Config.rope_scaling`` with transformers' parameter names; transformers scales the frequencies of the
rotary_dim rotated dims, as ``RotaryTable`` does. Refused by name (``config_from_neox``): any other
rope_type, an activation glassbox does not compute, and a rotary dim that is zero or odd. Checkpoints that name the
unembedding ``embed_out.weight`` (the hub's Pythia files) are read as ``lm_head.weight``; the causal
mask and rotary buffers older checkpoints saved are ignored. Every tensor's shape is checked.
"""

from typing import Mapping

import torch
from torch import Tensor

from ..models import Config
from ..models.config import ACT_FNS, ROPE_TYPES
from ..models.positional import rope_parameters_for_hf, scaled_context
from .family import Architecture
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from

NEOX_OPTIONS = dict(normalization="LN", norm_placement="pre", positional="rotary", rotary_style="half",
                    gated_mlp=False, use_bias=True, mlp_bias=True, unembed_bias=False, attn_only=False)
# Options GPT-NeoX has no field for, at the values its computation implies.
NEOX_FIXED = dict(attn_scale=None, scale_attn_by_inverse_layer_idx=False, upcast_attn=False, qk_norm=None,
                  attn_scores_soft_cap=None, output_logits_soft_cap=None, attn_types=None, window_size=None,
                  rotary_base_local=None, norm_weight_offset=0.0, scale_embed=False)
# Buffers older checkpoints saved (causal masks, rotary frequencies), not weights.
NEOX_IGNORED = (r"gpt_neox\.layers\.\d+\.attention\.(masked_)?bias",
                r"gpt_neox\.layers\.\d+\.attention\.rotary_emb\.inv_freq")

NEOX_CONFIG_FIELDS = {
    "num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size", "vocab_size": "size",
    "max_position_embeddings": "size", "intermediate_size": "size", "hidden_act": "str",
    "layer_norm_eps": "number", "initializer_range": "number>=0", "rotary_pct": "number",
    "rotary_emb_base": "number", "tie_word_embeddings": "bool", "use_parallel_residual": "bool",
    "attention_bias": "bool", "rope_parameters": "object?", "rope_scaling": "object?",
}
NEOX_WEIGHT_LAYOUT = ("num_hidden_layers", r"gpt_neox\.layers\.(\d+)\.",
                      [(("gpt_neox.embed_in.weight",), ("vocab_size", "hidden_size"))])


def config_from_neox(hf_config) -> Config:
    """A glassbox Config from a ``transformers.GPTNeoXConfig`` (refusing what glassbox does not compute)."""
    if getattr(hf_config, "model_type", None) != "gpt_neox":
        raise ValueError(f"expected a GPT-NeoX config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    act = hf_config.hidden_act
    if act not in ACT_FNS:
        raise ValueError(f"GPT-NeoX hidden_act {act!r} is not supported (glassbox computes {', '.join(ACT_FNS)})")
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = None
    if rope_type != "default":
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"GPT-NeoX rope_parameters rope_type={rope_type!r} is not supported (glassbox computes "
                             f"'default', {', '.join(map(repr, ROPE_TYPES))})")
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor", "type")}
        scaling["rope_type"] = rope_type
        if rope_type == "dynamic":  # transformers' dynamic type scales from max_position_embeddings
            scaling["original_max_position_embeddings"] = hf_config.max_position_embeddings
    heads, d_model = hf_config.num_attention_heads, hf_config.hidden_size
    d_head = d_model // heads
    pct = rope.get("partial_rotary_factor", 1.0)
    rotary_dim = int(d_head * pct)  # transformers' rounding
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"GPT-NeoX rotary_pct (partial_rotary_factor)={pct} gives {rotary_dim} rotary dims of "
                         f"d_head={d_head}; glassbox needs an even number > 0")
    attn_types_from(hf_config, "GPT-NeoX", "gpt_neox")  # its model never reads layer_types: checks the field
    bias = bool(hf_config.attention_bias)
    return Config(
        d_model=d_model, n_layers=hf_config.num_hidden_layers, n_heads=heads, d_vocab=hf_config.vocab_size,
        n_ctx=scaled_context(hf_config.max_position_embeddings, scaling), d_head=d_head,
        d_mlp=hf_config.intermediate_size, act_fn=act,
        layer_norm_eps=hf_config.layer_norm_eps, init_range=hf_config.initializer_range, rotary_dim=rotary_dim,
        rotary_base=float(rope.get("rope_theta", 10000.0)), rope_scaling=scaling,
        tied_unembed=bool(hf_config.tie_word_embeddings),
        parallel_attn_mlp=bool(hf_config.use_parallel_residual), parallel_ln2=bool(hf_config.use_parallel_residual),
        qkv_bias=bias, attn_out_bias=bias, model_name=getattr(hf_config, "name_or_path", "") or "gpt_neox",
        **NEOX_OPTIONS,
    )


def config_to_neox(cfg: Config):
    """A ``transformers.GPTNeoXConfig`` for a GPT-NeoX-architecture glassbox Config (ValueError naming
    every option it cannot represent)."""
    from transformers import GPTNeoXConfig

    wrong = {k: getattr(cfg, k) for k, v in {**NEOX_OPTIONS, **NEOX_FIXED}.items() if getattr(cfg, k) != v}
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        wrong["d_head"] = cfg.d_head
    if cfg.n_key_value_heads != cfg.n_heads:
        wrong["n_key_value_heads"] = cfg.n_key_value_heads
    if cfg.qkv_bias != cfg.attn_out_bias:
        wrong["qkv_bias != attn_out_bias"] = (cfg.qkv_bias, cfg.attn_out_bias)
    if cfg.parallel_ln2 != cfg.parallel_attn_mlp:
        wrong["parallel_ln2 != parallel_attn_mlp"] = (cfg.parallel_ln2, cfg.parallel_attn_mlp)
    pct = _rotary_pct(cfg) if cfg.positional == "rotary" else None
    if cfg.positional == "rotary" and pct is None:
        wrong["rotary_dim"] = cfg.rotary_dim
    scaling = cfg.rope_scaling or {}
    if wrong:
        raise ValueError(f"not a GPT-NeoX-architecture config: {wrong} (GPT-NeoX needs {NEOX_OPTIONS}, "
                         "d_head * n_heads == d_model, no grouped-query attention, one attention_bias for the "
                         "q/k/v and output projections, parallel_ln2 == parallel_attn_mlp, and none of "
                         f"{NEOX_FIXED} changed)")
    last = cfg.d_vocab - 1
    rope, original = rope_parameters_for_hf(cfg.rope_scaling, cfg.rotary_base)  # dynamic: its original length
    return GPTNeoXConfig(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        vocab_size=cfg.d_vocab, max_position_embeddings=original or cfg.n_ctx, intermediate_size=cfg.d_mlp,
        hidden_act=cfg.act_fn, layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.init_range,
        tie_word_embeddings=cfg.tied_unembed, use_parallel_residual=cfg.parallel_attn_mlp,
        attention_bias=cfg.qkv_bias,
        rope_parameters={**rope, "partial_rotary_factor": pct},
        bos_token_id=min(0, last), eos_token_id=min(2, last),
    )


def _rotary_pct(cfg: Config):
    """A partial_rotary_factor that transformers turns back into cfg.rotary_dim (int(d_head * pct)), or None."""
    pct = cfg.rotary_dim / cfg.d_head
    for candidate in (pct, float(torch.nextafter(torch.tensor(pct, dtype=torch.float64),
                                                 torch.tensor(2.0, dtype=torch.float64)))):
        if int(cfg.d_head * candidate) == cfg.rotary_dim:
            return candidate
    return None


# The per-layer tensors that are a plain copy (or a transpose) each way:
# (name under gpt_neox.layers.L., ours under blocks.L., transposed). The fused q/k/v is converted apart.
PLAIN_LAYER_TENSORS = (
    ("input_layernorm.weight", "ln1.w", False), ("input_layernorm.bias", "ln1.b", False),
    ("post_attention_layernorm.weight", "ln2.w", False), ("post_attention_layernorm.bias", "ln2.b", False),
    ("mlp.dense_h_to_4h.weight", "mlp.W_in", True), ("mlp.dense_h_to_4h.bias", "mlp.b_in", False),
    ("mlp.dense_4h_to_h.weight", "mlp.W_out", True), ("mlp.dense_4h_to_h.bias", "mlp.b_out", False),
)


def hf_expected_shapes(cfg: Config) -> dict:
    D, M, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"gpt_neox.embed_in.weight": (V, D), "gpt_neox.final_layer_norm.weight": (D,),
              "gpt_neox.final_layer_norm.bias": (D,)}
    for L in range(cfg.n_layers):
        h = f"gpt_neox.layers.{L}."
        shapes.update({
            h + "input_layernorm.weight": (D,), h + "input_layernorm.bias": (D,),
            h + "post_attention_layernorm.weight": (D,), h + "post_attention_layernorm.bias": (D,),
            h + "attention.query_key_value.weight": (3 * D, D), h + "attention.dense.weight": (D, D),
            h + "mlp.dense_h_to_4h.weight": (M, D), h + "mlp.dense_h_to_4h.bias": (M,),
            h + "mlp.dense_4h_to_h.weight": (D, M), h + "mlp.dense_4h_to_h.bias": (D,),
        })
        if cfg.qkv_bias:
            shapes.update({h + "attention.query_key_value.bias": (3 * D,), h + "attention.dense.bias": (D,)})
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def neox_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "GPT-NeoX state dict") -> dict:
    """HF GPTNeoXForCausalLM state dict -> our state dict (pure: the inputs are not modified)."""
    sd = {("lm_head." + k[len("embed_out."):] if k.startswith("embed_out.") else k): v
          for k, v in hf_state_dict.items()}
    expected = hf_expected_shapes(cfg)
    check_shapes(sd, expected, source)
    # A tied model's lm_head is W_E again (transformers lists it in the state dict).
    check_no_extras(sd, expected, source, NEOX_IGNORED + ((r"lm_head\.weight",) if cfg.tied_unembed else ()))
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    out = {"embed.W_E": sd["gpt_neox.embed_in.weight"], "ln_final.w": sd["gpt_neox.final_layer_norm.weight"],
           "ln_final.b": sd["gpt_neox.final_layer_norm.bias"]}
    for L in range(cfg.n_layers):
        h, p = f"gpt_neox.layers.{L}.", f"blocks.{L}."
        # [head*3*d_head d_model] -> per head [q; k; v] rows -> [3 head d_model d_head]
        qkv = sd[h + "attention.query_key_value.weight"].reshape(H, 3, Dh, D).permute(1, 0, 3, 2)
        for i, name in enumerate("QKV"):
            out[p + f"attn.W_{name}"] = qkv[i]
        out[p + "attn.W_O"] = sd[h + "attention.dense.weight"].T.reshape(H, Dh, D)
        if cfg.qkv_bias:
            qkv_b = sd[h + "attention.query_key_value.bias"].reshape(H, 3, Dh)
            for i, name in enumerate("QKV"):
                out[p + f"attn.b_{name}"] = qkv_b[:, i]
            out[p + "attn.b_O"] = sd[h + "attention.dense.bias"]
        out.update({p + ours: sd[h + theirs].T if transposed else sd[h + theirs]
                    for theirs, ours, transposed in PLAIN_LAYER_TENSORS})
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_neox(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF GPTNeoXForCausalLM state dict (contiguous tensors)."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    D = cfg.d_model
    out = {"gpt_neox.embed_in.weight": sd["embed.W_E"], "gpt_neox.final_layer_norm.weight": sd["ln_final.w"],
           "gpt_neox.final_layer_norm.bias": sd["ln_final.b"]}
    for L in range(cfg.n_layers):
        h, p = f"gpt_neox.layers.{L}.", f"blocks.{L}."
        # [3 head d_model d_head] -> [head 3 d_head d_model] -> rows head-major, then q/k/v, then d_head
        qkv = torch.stack([sd[p + f"attn.W_{n}"] for n in "QKV"]).permute(1, 0, 3, 2)
        out[h + "attention.query_key_value.weight"] = qkv.reshape(-1, D)
        out[h + "attention.dense.weight"] = sd[p + "attn.W_O"].reshape(-1, D).T
        if cfg.qkv_bias:
            out[h + "attention.query_key_value.bias"] = torch.stack([sd[p + f"attn.b_{n}"] for n in "QKV"], 1).reshape(-1)
            out[h + "attention.dense.bias"] = sd[p + "attn.b_O"]
        out.update({h + theirs: sd[p + ours].T if transposed else sd[p + ours]
                    for theirs, ours, transposed in PLAIN_LAYER_TENSORS})
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", config_from_neox, neox_to_glassbox,
                         config_to_neox, glassbox_to_neox, NEOX_CONFIG_FIELDS, NEOX_WEIGHT_LAYOUT,
                         tied_names=(("gpt_neox.embed_in.weight",), ("lm_head.weight", "embed_out.weight")))]
