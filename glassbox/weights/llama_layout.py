"""Hugging Face's "Llama layout" of a decoder and its conversion to and from glassbox, shared by the
Llama, Mistral, Qwen2/3, Gemma 1/2/3 and OLMo 2 converters (each keeps its own norm names and
placement, config mapping, and the checks of what it reads).

The whole model: ``model.embed_tokens.weight`` [d_vocab D] (embed.W_E), ``model.norm.weight`` [D]
(ln_final.w), ``lm_head.weight`` [d_vocab D] (unembed.W_U_T; absent when tied, W_E written on export),
and per layer under ``model.layers.{L}.`` the family's norms (``norms``: pairs (HF name, ours), e.g.
("input_layernorm", "ln1"), each [D]) and these (H heads, K key-value heads, d_head Dh, d_mlp M;
nn.Linear weights are [d_out d_in]):
- ``self_attn.q_proj.weight`` [H*Dh D], ``k_proj`` and ``v_proj`` [K*Dh D], ``o_proj`` [D H*Dh];
  with ``cfg.qkv_bias`` q/k/v biases [H*Dh] / [K*Dh]; with ``cfg.attn_out_bias`` ``o_proj.bias`` [D].
- ``cfg.qk_norm``: "head" gives ``self_attn.q_norm.weight`` and ``k_norm.weight`` [Dh] (one weight
  shared by the heads); "full" gives [H*Dh] and [K*Dh] (one norm over all heads together).
- ``mlp.gate_proj`` and ``mlp.up_proj`` [M D], ``mlp.down_proj`` [D M]; with ``cfg.mlp_bias`` their
  biases [M], [M], [D].

Ours right-multiply, so each matrix is transposed and the per-head ones split along head * d_head in
HF's order (already permuted for the "half" rotation; query head h reads kv head h // groups):
W_Q [head d_model d_head], W_O [head d_head d_model], b_Q [head d_head], W_gate/W_in [d_model d_mlp].

One table (``decoder_tensors``) lists each tensor with its HF shape and the map each way, so the
shapes, the conversion and its inverse cannot drift apart. Footgun: the converters check nothing; a
caller checks every tensor's shape against ``decoder_shapes`` first (the reshapes assume those
shapes). Results may be views of the inputs (nothing is modified); ``decoder_to_hf``'s are contiguous.
"""

from typing import Callable, List, Mapping, Tuple

from torch import Tensor

from ..models import Config

# (glassbox name under mlp., HF name under mlp.)
MLP_NAMES = (("gate", "gate_proj"), ("in", "up_proj"), ("out", "down_proj"))
# (HF name, ours, HF shape, HF -> ours, ours -> HF)
Entry = Tuple[str, str, tuple, Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]


def _same(t: Tensor) -> Tensor:
    return t


def _transpose(t: Tensor) -> Tensor:
    return t.T


def layer_tensors(cfg: Config, hf_prefix: str, our_prefix: str) -> List[Entry]:
    """The attention and MLP tensors of one layer, HF's under ``hf_prefix`` and ours under
    ``our_prefix``: the q/k/v/o and gate/up/down weights, then the q/k/v, o and MLP biases the
    config's flags ask for, then the q/k norms."""
    D, Dh, M, H = cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.n_heads
    Q, KV = H * Dh, cfg.n_key_value_heads * Dh
    a, m, p = hf_prefix + "self_attn.", hf_prefix + "mlp.", our_prefix

    def split(t: Tensor) -> Tensor:  # [head*d_head d_model] -> [head d_model d_head] (kv heads for K, V)
        return t.reshape(-1, Dh, D).transpose(1, 2)

    def merge(t: Tensor) -> Tensor:
        return t.transpose(1, 2).reshape(-1, D)

    qkv = tuple(zip("QKV", "qkv", (Q, KV, KV)))
    out = [(a + f"{proj}_proj.weight", p + f"attn.W_{name}", (rows, D), split, merge) for name, proj, rows in qkv]
    out.append((a + "o_proj.weight", p + "attn.W_O", (D, Q), lambda t: t.T.reshape(H, Dh, D),
                lambda t: t.reshape(-1, D).T))
    mlp = [(ours, theirs, shape) for (ours, theirs), shape in zip(MLP_NAMES, ((M, D), (M, D), (D, M)))]
    out += [(m + f"{theirs}.weight", p + f"mlp.W_{ours}", shape, _transpose, _transpose) for ours, theirs, shape in mlp]
    if cfg.qkv_bias:
        out += [(a + f"{proj}_proj.bias", p + f"attn.b_{name}", (rows,), lambda t: t.reshape(-1, Dh),
                 lambda t: t.reshape(-1)) for name, proj, rows in qkv]
    if cfg.attn_out_bias:
        out.append((a + "o_proj.bias", p + "attn.b_O", (D,), _same, _same))
    if cfg.mlp_bias:
        out += [(m + f"{theirs}.bias", p + f"mlp.b_{ours}", shape[:1], _same, _same) for ours, theirs, shape in mlp]
    if cfg.qk_norm is not None:
        q_shape, k_shape = ((Dh,), (Dh,)) if cfg.qk_norm == "head" else ((Q,), (KV,))
        out += [(a + "q_norm.weight", p + "attn.q_norm.w", q_shape, _same, _same),
                (a + "k_norm.weight", p + "attn.k_norm.w", k_shape, _same, _same)]
    return out


def decoder_tensors(cfg: Config, norms) -> List[Entry]:
    """Every tensor of the model: embeddings, final norm, each layer's ``norms`` (pairs (HF name, ours))
    then its attention and MLP, and an untied lm_head."""
    D, V = cfg.d_model, cfg.d_vocab
    out = [("model.embed_tokens.weight", "embed.W_E", (V, D), _same, _same),
           ("model.norm.weight", "ln_final.w", (D,), _same, _same)]
    for L in range(cfg.n_layers):
        h, p = f"model.layers.{L}.", f"blocks.{L}."
        out += [(h + f"{hf}.weight", p + f"{ours}.w", (D,), _same, _same) for hf, ours in norms]
        out += layer_tensors(cfg, h, p)
    if not cfg.tied_unembed:
        out.append(("lm_head.weight", "unembed.W_U_T", (V, D), _same, _same))
    return out


def decoder_shapes(cfg: Config, norms) -> dict:
    """HF's tensor names and shapes for the whole model (``decoder_tensors``' order)."""
    return {hf: shape for hf, _, shape, _, _ in decoder_tensors(cfg, norms)}


def decoder_to_glassbox(sd: Mapping[str, Tensor], cfg: Config, norms) -> dict:
    """HF state dict (shapes checked) -> ours; a tied model's lm_head.weight is not read."""
    return {ours: to_ours(sd[hf]) for hf, ours, _, to_ours, _ in decoder_tensors(cfg, norms)}


def decoder_to_hf(sd: Mapping[str, Tensor], cfg: Config, norms) -> dict:
    """Our state dict (shapes checked) -> HF's, contiguous tensors; a tied lm_head.weight is W_E."""
    out = {hf: to_hf(sd[ours]) for hf, ours, _, _, to_hf in decoder_tensors(cfg, norms)}
    if cfg.tied_unembed:
        out["lm_head.weight"] = sd["embed.W_E"]
    return {k: v.contiguous() for k, v in out.items()}
