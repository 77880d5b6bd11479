"""Pure converters between a ``transformers`` OPT (OPTForCausalLM) and glassbox, both ways.

OPT is GPT-2's block with separate q/k/v/out projections (nn.Linear, [d_out d_in]) and an MLP of
``fc1``/``fc2`` (ReLU in every released model), LayerNorms of a fixed eps 1e-5 (transformers builds
``nn.LayerNorm`` with its default), a tied unembedding without bias, and learned positions stored with
an offset of 2: ``embed_positions`` has max_position_embeddings + 2 rows and position p reads row p + 2.
Our W_pos is rows 2.. of it; rows 0 and 1 are read by no real token (transformers gives a padded
position the id -1, so row 1; glassbox's padded positions are never read), so an export writes them
as zeros and a round trip through transformers keeps everything else bit for bit.

Positions: transformers counts real tokens (cumsum of the attention mask - 1), as glassbox does
(``models/masks.py``), so left-padded batches agree at every real position.

Mapped exactly: ``do_layer_norm_before`` False (the post-LN block, x = LN(x + f(x)), no final norm:
norm_placement "post"); ``enable_bias`` False (no bias in the projections and the MLP; the norms keep
theirs: qkv_bias = attn_out_bias = mlp_bias = False); ``layer_norm_elementwise_affine`` False (norms
without weights: loaded as weight 1 and bias 0, which compute the same bits); an untied lm_head.
Refused, naming the field: ``word_embed_proj_dim`` != hidden_size (OPT-350m's project_in/project_out
around the blocks: folding them into W_E and W_U would round differently), ``_remove_final_layer_norm``
on a pre-LN model (a pre-norm block without the final norm), an activation glassbox does not compute,
and a ``layer_types`` with sliding layers (OPT's model never reads it: ``layer_types.py``).

Footgun: an OPT model's Config is also a GPT-2 one (pre-LN, learned positions, biases), so ``to_hf``
and ``save_pretrained`` write it as GPT2LMHeadModel, which computes the same logits; ``glassbox_to_opt``
and ``config_to_opt`` write OPT's own layout. Every tensor's shape is checked.
"""

from typing import Mapping

import torch
from torch import Tensor

from ..models import Config
from ..models.activations import PARAMETRISED_ACTIVATIONS
from .family import Architecture, check_hf_activation, options_beyond
from .gpt2 import check_no_extras, check_shapes, expected_shapes
from .layer_types import attn_types_from

OFFSET = 2  # transformers' OPTLearnedPositionalEmbedding.offset
LN_EPS = 1e-5  # nn.LayerNorm's default, which OPT's layers and final norm use
OPT_SHAPE = dict(normalization="LN", positional="learned", gated_mlp=False, use_bias=True, unembed_bias=False,
                 parallel_attn_mlp=False, attn_only=False)

OPT_CONFIG_FIELDS = {
    "num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size", "vocab_size": "size",
    "max_position_embeddings": "size", "ffn_dim": "size", "word_embed_proj_dim": "size?",
    "activation_function": "str", "do_layer_norm_before": "bool", "_remove_final_layer_norm": "bool",
    "enable_bias": "bool", "layer_norm_elementwise_affine": "bool", "init_std": "number>=0",
    "tie_word_embeddings": "bool",
}
OPT_WEIGHT_LAYOUT = ("num_hidden_layers", r"(?:model\.)?decoder\.layers\.(\d+)\.",
                     [(("model.decoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
                       ("vocab_size", "hidden_size"))])
DECODER = "model.decoder."


def config_from_opt(hf_config) -> Config:
    """A glassbox Config from a ``transformers.OPTConfig`` (refusing what glassbox does not compute)."""
    if getattr(hf_config, "model_type", None) != "opt":
        raise ValueError(f"expected an OPT config, got model_type={getattr(hf_config, 'model_type', None)!r}")
    act = hf_config.activation_function
    check_hf_activation(act, "OPT")
    proj = hf_config.word_embed_proj_dim
    if proj is not None and proj != hf_config.hidden_size:
        raise ValueError(f"OPT word_embed_proj_dim={proj} differs from hidden_size={hf_config.hidden_size}: the "
                         "project_in/project_out maps around the blocks (OPT-350m) are not computed by glassbox")
    pre = bool(hf_config.do_layer_norm_before)
    if pre and getattr(hf_config, "_remove_final_layer_norm", False):
        raise ValueError("OPT _remove_final_layer_norm=True with do_layer_norm_before=True (a pre-LN model without "
                         "its final norm) is not computed by glassbox")
    attn_types_from(hf_config, "OPT", "opt")  # its model never reads layer_types: checks the field
    bias = bool(hf_config.enable_bias)
    return Config(
        d_model=hf_config.hidden_size, n_layers=hf_config.num_hidden_layers, n_heads=hf_config.num_attention_heads,
        d_vocab=hf_config.vocab_size, n_ctx=hf_config.max_position_embeddings, d_mlp=hf_config.ffn_dim, act_fn=act,
        layer_norm_eps=LN_EPS, init_range=hf_config.init_std, norm_placement="pre" if pre else "post",
        qkv_bias=bias, attn_out_bias=bias, mlp_bias=bias, tied_unembed=bool(hf_config.tie_word_embeddings),
        model_name=getattr(hf_config, "name_or_path", "") or "opt", **OPT_SHAPE,
    )


def config_to_opt(cfg: Config):
    """A ``transformers.OPTConfig`` for an OPT-architecture glassbox Config (ValueError naming every
    option it cannot represent)."""
    from transformers import OPTConfig

    wrong = {k: getattr(cfg, k) for k, v in OPT_SHAPE.items() if getattr(cfg, k) != v}
    if cfg.norm_placement not in ("pre", "post"):
        wrong["norm_placement"] = cfg.norm_placement
    wrong.update(options_beyond(cfg, allowed=("qkv_bias", "attn_out_bias", "mlp_bias")))
    if not cfg.qkv_bias == cfg.attn_out_bias == cfg.mlp_bias:
        wrong["qkv_bias, attn_out_bias, mlp_bias"] = (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias)
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        wrong["d_head"] = cfg.d_head
    if cfg.layer_norm_eps != LN_EPS:
        wrong["layer_norm_eps"] = cfg.layer_norm_eps
    if cfg.act_fn in PARAMETRISED_ACTIVATIONS:
        wrong["act_fn"] = cfg.act_fn
    if wrong:
        raise ValueError(f"not an OPT-architecture config: {wrong} (OPT needs {OPT_SHAPE}, pre- or post-LN, "
                         f"d_head * n_heads == d_model, layer_norm_eps {LN_EPS}, one enable_bias for the "
                         "projections and the MLP, and no other family option)")
    last = cfg.d_vocab - 1
    return OPTConfig(
        hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        vocab_size=cfg.d_vocab, max_position_embeddings=cfg.n_ctx, ffn_dim=cfg.d_mlp, word_embed_proj_dim=cfg.d_model,
        activation_function=cfg.act_fn, do_layer_norm_before=cfg.norm_placement == "pre",
        enable_bias=cfg.qkv_bias, layer_norm_elementwise_affine=True, init_std=cfg.init_range,
        tie_word_embeddings=cfg.tied_unembed, pad_token_id=min(1, last), bos_token_id=min(2, last),
        eos_token_id=min(2, last),
    )


def _norms(cfg: Config, L: int) -> list:
    """(theirs under the decoder, ours) of layer L's two norms."""
    h, p = f"{DECODER}layers.{L}.", f"blocks.{L}."
    return [(h + "self_attn_layer_norm.", p + "ln1."), (h + "final_layer_norm.", p + "ln2.")]


def _has_final_norm(cfg: Config) -> bool:
    return cfg.norm_placement == "pre"


def hf_expected_shapes(cfg: Config, affine: bool = True) -> dict:
    D, M, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {DECODER + "embed_tokens.weight": (V, D), DECODER + "embed_positions.weight": (cfg.n_ctx + OFFSET, D)}
    norms = [(DECODER + "final_layer_norm.", None)] if _has_final_norm(cfg) else []
    for L in range(cfg.n_layers):
        h = f"{DECODER}layers.{L}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[h + f"self_attn.{proj}.weight"] = (D, D)
            if cfg.qkv_bias:
                shapes[h + f"self_attn.{proj}.bias"] = (D,)
        shapes.update({h + "fc1.weight": (M, D), h + "fc2.weight": (D, M)})
        if cfg.mlp_bias:
            shapes.update({h + "fc1.bias": (M,), h + "fc2.bias": (D,)})
        norms += _norms(cfg, L)
    if affine:
        for theirs, _ in norms:
            shapes.update({theirs + "weight": (D,), theirs + "bias": (D,)})
    if not cfg.tied_unembed:
        shapes["lm_head.weight"] = (V, D)
    return shapes


def opt_to_glassbox(hf_state_dict: Mapping[str, Tensor], cfg: Config, source: str = "OPT state dict") -> dict:
    """HF OPTForCausalLM (or OPTModel) state dict -> our state dict (pure: the inputs are not modified).
    Norms without weights (layer_norm_elementwise_affine=False) become weight 1, bias 0."""
    sd = {k if k.startswith(("model.", "lm_head.")) else "model." + k: v for k, v in hf_state_dict.items()}
    affine = DECODER + "layers.0.self_attn_layer_norm.weight" in sd or cfg.n_layers == 0
    expected = hf_expected_shapes(cfg, affine)
    check_shapes(sd, expected, source)
    check_no_extras(sd, expected, source, (r"lm_head\.weight",) if cfg.tied_unembed else ())
    D, H, Dh = cfg.d_model, cfg.n_heads, cfg.d_head
    W_E = sd[DECODER + "embed_tokens.weight"]
    out = {"embed.W_E": W_E, "pos_embed.W_pos": sd[DECODER + "embed_positions.weight"][OFFSET:]}
    norms = [(DECODER + "final_layer_norm.", "ln_final.")] if _has_final_norm(cfg) else []
    for L in range(cfg.n_layers):
        h, p = f"{DECODER}layers.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[p + f"attn.W_{name}"] = sd[h + f"self_attn.{proj}_proj.weight"].reshape(H, Dh, D).transpose(1, 2)
            if cfg.qkv_bias:
                out[p + f"attn.b_{name}"] = sd[h + f"self_attn.{proj}_proj.bias"].reshape(H, Dh)
        out[p + "attn.W_O"] = sd[h + "self_attn.out_proj.weight"].T.reshape(H, Dh, D)
        out[p + "mlp.W_in"], out[p + "mlp.W_out"] = sd[h + "fc1.weight"].T, sd[h + "fc2.weight"].T
        if cfg.attn_out_bias:
            out[p + "attn.b_O"] = sd[h + "self_attn.out_proj.bias"]
        if cfg.mlp_bias:
            out[p + "mlp.b_in"], out[p + "mlp.b_out"] = sd[h + "fc1.bias"], sd[h + "fc2.bias"]
        norms += _norms(cfg, L)
    for theirs, ours in norms:
        if affine:
            out[ours + "w"], out[ours + "b"] = sd[theirs + "weight"], sd[theirs + "bias"]
        else:
            out[ours + "w"], out[ours + "b"] = W_E.new_ones(D), W_E.new_zeros(D)
    if not cfg.tied_unembed:
        out["unembed.W_U_T"] = sd["lm_head.weight"]
    return out


def glassbox_to_opt(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Our state dict -> HF OPTForCausalLM state dict (contiguous tensors; embed_positions' rows 0 and 1,
    which no real token reads, are zeros)."""
    sd = state_dict
    check_shapes(sd, expected_shapes(cfg), "glassbox state dict")
    D = cfg.d_model
    W_pos = sd["pos_embed.W_pos"]
    out = {DECODER + "embed_tokens.weight": sd["embed.W_E"],
           DECODER + "embed_positions.weight": torch.cat([W_pos.new_zeros(OFFSET, D), W_pos])}
    norms = [(DECODER + "final_layer_norm.", "ln_final.")] if _has_final_norm(cfg) else []
    for L in range(cfg.n_layers):
        h, p = f"{DECODER}layers.{L}.", f"blocks.{L}."
        for name, proj in zip("QKV", "qkv"):
            out[h + f"self_attn.{proj}_proj.weight"] = sd[p + f"attn.W_{name}"].transpose(1, 2).reshape(-1, D)
            if cfg.qkv_bias:
                out[h + f"self_attn.{proj}_proj.bias"] = sd[p + f"attn.b_{name}"].reshape(-1)
        out[h + "self_attn.out_proj.weight"] = sd[p + "attn.W_O"].reshape(-1, D).T
        out[h + "fc1.weight"], out[h + "fc2.weight"] = sd[p + "mlp.W_in"].T, sd[p + "mlp.W_out"].T
        if cfg.attn_out_bias:
            out[h + "self_attn.out_proj.bias"] = sd[p + "attn.b_O"]
        if cfg.mlp_bias:
            out[h + "fc1.bias"], out[h + "fc2.bias"] = sd[p + "mlp.b_in"], sd[p + "mlp.b_out"]
        norms += _norms(cfg, L)
    for theirs, ours in norms:
        out[theirs + "weight"], out[theirs + "bias"] = sd[ours + "w"], sd[ours + "b"]
    out["lm_head.weight"] = sd["unembed.W_U_T"] if not cfg.tied_unembed else sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}


FAMILIES = [Architecture("opt", "OPTConfig", "OPTForCausalLM", config_from_opt, opt_to_glassbox, config_to_opt,
                         glassbox_to_opt, OPT_CONFIG_FIELDS, OPT_WEIGHT_LAYOUT,
                         tied_names=((DECODER + "embed_tokens.weight", "decoder.embed_tokens.weight"),
                                     ("lm_head.weight",)))]
