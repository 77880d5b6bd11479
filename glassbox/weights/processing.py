"""Weight processing that leaves a model's predictions unchanged: pure state dict -> state dict.

- ``fold_ln``: each norm that reads the residual stream and feeds only matrices (ln1, ln2, ln_final)
  moves its effective weight (w, or ``cfg.norm_weight_offset`` + w) and LayerNorm bias b into the
  matrices that read its output (W_Q/W_K/W_V, W_in/W_gate, W_U; b into their biases, ln_final's b into
  a new b_U). The norm is left with an effective weight of 1 (w = 1 - offset: w = 1, Gemma's w = 0)
  and b = 0; it still normalises, so the model computes the same function. With ``mlp_ln`` the MLP's
  norm over d_mlp folds the same way into W_out [d_mlp d_model] and b_out (and ``center_reader_weights``
  removes W_out's mean over d_mlp), as TransformerLens folds its SoLU MLPs' ``mlp.ln``. Grouped keys and values
  fold per kv head. Norms that read a sublayer's output stay as they are: the sandwich post-norms
  ln1_post/ln2_post, the output norms ln1/ln2 of norm_placement "output" (there only ln_final folds),
  and the q/k norms (the folded W_Q/W_K give them the same input). Refused for norm_placement "post"
  and where a LayerNorm bias has no bias in a reader to go to (qkv_bias or mlp_bias False).
- ``center_writing_weights``: every matrix writing to the residual stream (W_E, W_pos, W_O, b_O,
  W_out, b_out) has its mean over d_model removed. Exact only because every reader is a LayerNorm,
  which removes that mean anyway: refused for RMSNorm, and for the placements in which the sublayers
  write through a norm ("post", "sandwich", "output": normalized * w + b cannot be centred by weights).
- ``center_unembed``: W_U (and b_U) get their mean over the vocabulary removed; logits move by a
  constant per position, so log-probs are unchanged, logits are not. Refused with
  output_logits_soft_cap (the tanh cap does not commute with the shift).
- ``fold_value_biases``: b_V moves into b_O (b_O += sum_h b_V[kv(h)] @ W_O[h], each query head with
  its kv head's bias), exact because each attention pattern row sums to 1. A model with b_V but no
  b_O (qkv_bias without attn_out_bias: Qwen2) gets one, and its Config attn_out_bias=True.
- ``center_reader_weights`` (after ``fold_ln``, LayerNorm models): every matrix reading a norm's
  output (W_Q/W_K/W_V, W_in, W_gate, W_U) has its mean over d_model removed. Exact because a folded
  LayerNorm's output has zero mean over d_model; refused while any norm still has w != 1 or b != 0.
- ``refactor_factored_attn_matrices``: each head's QK and OV circuits are refactored through their
  SVDs, W_Q' = U_QK sqrt(S), W_K' = V_QK sqrt(S) (the biases ride along as an extra input row that
  is always 1, so the bilinear form of (x W_Q + b_Q) and (y W_K + b_K) is kept), W_V' = U_OV S,
  W_O' = V_OV^T (orthonormal rows), b_O += sum_h b_V[h] @ W_O[h], b_V = 0. Every attention score and
  head output is unchanged to rounding, so a score soft cap (a function of the score) and any norm
  after the attention see the same values. Refused with rotary positions (scores depend on
  positions), q/k norms (they act on the factors themselves), grouped-query attention (a kv head's
  W_K, W_V are shared by several query heads, so no one factor fits each head). A b_V without b_O
  gets a b_O first, as in ``fold_value_biases``.
  Singular vectors are unique only up to sign: compare products, not factors. The SVDs run on one
  CPU thread (the caller's torch.get_num_threads() is restored after): matrices of [head d_model+1
  d_head] gain nothing from threads, and on a busy machine threaded LAPACK waits on every core in
  each of its many small steps (GPT-2 small: 85 s at 2 threads, about 1 s on one); one thread also
  gives the same bits whatever the caller's thread count.

Every refusal is a ValueError naming the step and the Config option that prevents it; the input
is never changed. Each function takes (state_dict, cfg) and returns a new dict (inputs untouched),
computing in float64 and casting back. A tied unembedding is untied first (the result has
``unembed.W_U_T``): folding or centering must not change W_U through W_E. ``config_for`` gives the
Config matching a processed state dict (no step changes any other field: fold_ln keeps
norm_weight_offset and writes w = 1 - offset). Applying a function twice is idempotent (to
rounding); ``process`` records the steps on ``model.processing`` and skips steps already recorded,
so analysis code can tell, e.g., that norm weights are 1 because they were folded.
"""

from contextlib import contextmanager
from typing import Callable, Mapping

import torch
from torch import Tensor

from ..models import Config, HookedTransformer, HookFlags

STEPS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
# Every step, in the order process applies them (TransformerLens's order; STEPS are the classic four).
ALL_STEPS = ("fold_ln", "center_reader_weights", "center_writing_weights", "center_unembed", "fold_value_biases",
             "refactor_factored_attn_matrices")


def _untied(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    sd = dict(state_dict)
    if "unembed.W_U_T" not in sd:
        sd["unembed.W_U_T"] = sd["embed.W_E"].clone()
    return sd


def _refuse_post_norm(cfg: Config, step: str) -> None:
    if cfg.norm_placement == "post":
        raise ValueError(f"{step} needs a pre-norm model; norm_placement='post' normalises after the residual "
                         "add, so there is no norm in front of each reader to fold or rely on")


def _apply(t: Tensor, fn: Callable, *others: Tensor) -> Tensor:
    """fn on float64 copies of t and others, cast back to t's dtype."""
    return fn(t.double(), *(o.double() for o in others)).to(t.dtype)


def _readers(cfg: Config, sd: Mapping[str, Tensor]) -> list:
    """(norm, [matrices reading its output]) for every norm that reads the residual stream and feeds
    matrices only: ln1 and ln2 (not with norm_placement "output", whose ln1/ln2 read the sublayers'
    outputs), ln_final, and mlp_ln's mlp.ln (it reads the activation, and only W_out reads it; its
    "d_model axis" below is W_out's d_mlp axis, 0). In a GPT-J parallel block ln1 feeds the attention and the MLP; with
    parallel_ln2 (GPT-NeoX) ln2 feeds the MLP."""
    pairs = []
    for L in range(cfg.n_layers if cfg.norm_placement != "output" else 0):
        p = f"blocks.{L}."
        attn = [p + "attn.W_Q", p + "attn.W_K", p + "attn.W_V"]
        mlp = [k for k in (p + "mlp.W_in", p + "mlp.W_gate") if k in sd]  # none in an attention-only block
        if cfg.parallel_attn_mlp and not cfg.parallel_ln2:
            pairs.append((p + "ln1", attn + mlp))
        else:
            pairs.append((p + "ln1", attn))
            if p + "ln2.w" in sd:
                pairs.append((p + "ln2", mlp))
        if p + "mlp.ln.w" in sd:  # mlp_ln: the MLP's own norm over d_mlp, read by W_out [d_mlp d_model]
            pairs.append((p + "mlp.ln", [p + "mlp.W_out"]))
    pairs.append(("ln_final", ["unembed.W_U_T"]))
    return pairs


def fold_ln(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Fold every input norm's effective weight (and b) into the weights that read it; those norms are
    left with offset + w = 1 and b = 0 (norms on sublayer outputs and q/k norms are kept, see above)."""
    _refuse_post_norm(cfg, "fold_ln")
    sd = _untied(state_dict, cfg)
    for norm, readers in _readers(cfg, sd):
        _fold_norm(sd, cfg, norm, readers)
    return sd


def center_reader_weights(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Remove the d_model mean of every matrix reading a folded LayerNorm (run ``fold_ln`` first).

    A LayerNorm with w = 1 and b = 0 outputs a vector with zero mean over d_model, so the part of a
    reader constant along d_model multiplies zero. With any other w or b it does not, so a norm not
    yet folded is refused by name (as are RMSNorm, which does not centre, and post-norm models).
    """
    _refuse_post_norm(cfg, "center_reader_weights")
    if cfg.normalization != "LN":
        raise ValueError(f"center_reader_weights relies on LayerNorm removing the mean; "
                         f"normalization={cfg.normalization!r} does not")
    sd = _untied(state_dict, cfg)
    for norm, readers in _readers(cfg, sd):
        w, b = sd[norm + ".w"], sd.get(norm + ".b")
        if not bool((w == 1).all()) or (b is not None and bool((b != 0).any())):
            raise ValueError(f"center_reader_weights needs folded norms (w = 1, b = 0), but {norm} has other "
                             "values: apply fold_ln first")
        for key in readers:
            # The d_model axis: W_Q [head d_model d_head], W_in [d_model d_mlp], W_U_T [d_vocab d_model].
            axis = -1 if key.endswith("W_U_T") else (1 if sd[key].ndim == 3 else 0)
            sd[key] = _apply(sd[key], lambda t: t - t.mean(axis, keepdim=True))
    return sd


def _bias_key(weight_key: str) -> str:
    prefix, leaf = weight_key.rsplit(".", 1)
    return "unembed.b_U" if leaf == "W_U_T" else f"{prefix}.b_{leaf[2:]}"


def _fold_norm(sd: dict, cfg: Config, norm: str, readers: list) -> None:
    w, b = sd[norm + ".w"], sd.get(norm + ".b")
    offset = float(cfg.norm_weight_offset)
    for key in readers:
        bias_key = _bias_key(key)
        if b is not None and bias_key not in sd and bias_key != "unembed.b_U":
            option = "qkv_bias" if ".attn." in key else "mlp_bias"
            why = (f"Config.gated_mlp_bias='product' adds b_in after the gate, so no bias sits on {key}"
                   if cfg.gated_mlp and cfg.gated_mlp_bias == "product" and ".mlp." in key
                   else f"Config.{option}=False while the LayerNorms have biases")
            raise ValueError(f"fold_ln cannot fold {norm}.b into {key}: the model has no {bias_key} ({why})")
    for key in readers:
        W, bias_key = sd[key], _bias_key(key)
        # The d_model axis of each reader: W_Q [head d_model d_head], W_in [d_model d_mlp], W_U_T [d_vocab d_model].
        if key.endswith("W_U_T"):
            sd[key] = _apply(W, lambda W, w: W * (offset + w), w)
            shift = None if b is None else _apply(W, lambda W, b: W @ b, b)
        elif W.ndim == 3:  # W_Q [head ...], or W_K/W_V [kv_head ...]: the same fold per (kv) head
            sd[key] = _apply(W, lambda W, w: W * (offset + w)[None, :, None], w)
            shift = None if b is None else _apply(W, lambda W, b: torch.einsum("d,hde->he", b, W), b)
        else:
            sd[key] = _apply(W, lambda W, w: W * (offset + w)[:, None], w)
            shift = None if b is None else _apply(W, lambda W, b: b @ W, b)
        if shift is None:
            continue
        if bias_key in sd:
            sd[bias_key] = _apply(sd[bias_key], lambda old, s: old + s, shift)
        else:  # unembed.b_U: config_for records unembed_bias=True
            sd[bias_key] = shift
    sd[norm + ".w"] = torch.full_like(w, 1.0 - offset)  # offset + w = 1 (exactly so for offsets 0 and 1)
    if b is not None:
        sd[norm + ".b"] = torch.zeros_like(b)


def center_writing_weights(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Remove the d_model mean of everything written to the residual stream (pre-LayerNorm models only)."""
    _refuse_post_norm(cfg, "center_writing_weights")
    if cfg.normalization != "LN":
        raise ValueError(f"center_writing_weights relies on LayerNorm removing the mean; "
                         f"normalization={cfg.normalization!r} does not")
    if cfg.norm_placement in ("sandwich", "output"):
        norms = "ln1_post/ln2_post" if cfg.norm_placement == "sandwich" else "ln1/ln2"
        raise ValueError(f"center_writing_weights cannot centre what norm_placement={cfg.norm_placement!r} writes to "
                         f"the residual stream: the sublayers write through {norms}, whose output normalized * w + b "
                         "has a mean over d_model that depends on the input, which no change of weights removes")
    sd = _untied(state_dict, cfg)
    writers = ["embed.W_E", "pos_embed.W_pos"]  # scale_embed multiplies W_E's rows: still centred
    for L in range(cfg.n_layers):
        writers += [f"blocks.{L}.attn.W_O", f"blocks.{L}.attn.b_O", f"blocks.{L}.mlp.W_out", f"blocks.{L}.mlp.b_out"]
    for key in writers:
        if key in sd:  # absent: sinusoidal or rotary positions, or no biases
            sd[key] = _apply(sd[key], lambda t: t - t.mean(-1, keepdim=True))
    return sd


def center_unembed(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Remove W_U's (and b_U's) mean over the vocabulary: logits shift by a constant per position."""
    if cfg.output_logits_soft_cap is not None:
        raise ValueError(f"center_unembed is not exact with output_logits_soft_cap={cfg.output_logits_soft_cap}: "
                         "cap * tanh(logits / cap) of logits shifted by a constant is not the capped logits "
                         "shifted by a constant, so the log-probs would change")
    sd = _untied(state_dict, cfg)
    sd["unembed.W_U_T"] = _apply(sd["unembed.W_U_T"], lambda t: t - t.mean(0, keepdim=True))
    if "unembed.b_U" in sd:
        sd["unembed.b_U"] = _apply(sd["unembed.b_U"], lambda t: t - t.mean())
    return sd


def fold_value_biases(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Move b_V into b_O; a model without b_V is returned unchanged (there is nothing to fold). A model
    with b_V but no b_O (Qwen2: qkv_bias without attn_out_bias) gets a b_O, zero plus the folded
    biases, as TransformerLens's always-present b_O does; ``config_for`` then records attn_out_bias."""
    sd = dict(state_dict)
    for L in range(cfg.n_layers):
        a = f"blocks.{L}.attn."
        if a + "b_V" not in sd:
            continue
        b_V = sd[a + "b_V"]  # [kv_head d_head]: query head h reads kv head h // n_kv_groups
        if a + "b_O" not in sd:
            sd[a + "b_O"] = b_V.new_zeros(cfg.d_model)
        per_head = lambda b_V: b_V.repeat_interleave(cfg.n_kv_groups, dim=0)  # noqa: E731
        sd[a + "b_O"] = _apply(sd[a + "b_O"],
                               lambda b_O, b_V, W_O: b_O + torch.einsum("he,hed->d", per_head(b_V), W_O),
                               b_V, sd[a + "W_O"])
        sd[a + "b_V"] = torch.zeros_like(b_V)
    return sd


@contextmanager
def _one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _svd_of_product(A: Tensor, B: Tensor) -> tuple:
    """(U, S, V) of A @ B with A [head m k] and B [head k n], from the SVDs of the factors (A @ B is
    never formed): U [head m r], S [head r], V [head n r], r = min(m, k, n)."""
    U_A, S_A, Vh_A = torch.linalg.svd(A, full_matrices=False)
    U_B, S_B, Vh_B = torch.linalg.svd(B, full_matrices=False)
    U_m, S, Vh_m = torch.linalg.svd(S_A[..., :, None] * (Vh_A @ U_B) * S_B[..., None, :], full_matrices=False)
    return U_A @ U_m, S, (Vh_m @ Vh_B).transpose(-2, -1)


def _refactor_qk(W_Q: Tensor, W_K: Tensor, b_Q, b_K) -> tuple:
    """Even factors of each head's bilinear form; biases as an extra input row (an input of 1)."""
    if b_Q is not None:
        W_Q, W_K = torch.cat([W_Q, b_Q[:, None, :]], dim=1), torch.cat([W_K, b_K[:, None, :]], dim=1)
    U, S, V = _svd_of_product(W_Q, W_K.transpose(-2, -1))
    root = S.sqrt()[:, None, :]
    W_Q, W_K = U * root, V * root  # W_Q' W_K'^T = U S V^T
    if b_Q is None:
        return W_Q, W_K, None, None
    return W_Q[:, :-1], W_K[:, :-1], W_Q[:, -1], W_K[:, -1]


def refactor_factored_attn_matrices(state_dict: Mapping[str, Tensor], cfg: Config) -> dict:
    """Refactor each head's W_Q, W_K (with b_Q, b_K) and W_V, W_O through the SVDs of their products.

    Keeps every attention score and head output (to rounding); see the module docstring for the
    factors chosen. b_V is folded into b_O first, as ``fold_value_biases`` does. Refused with rotary
    positions, where the score is not a fixed bilinear form of the residual streams; with q/k norms,
    which normalise (and weight per coordinate) the factors' outputs, so new factors change them; with
    grouped-query attention, where one kv head's W_K and W_V serve several query heads.
    """
    step = "refactor_factored_attn_matrices"
    if cfg.positional == "rotary":
        raise ValueError(f"{step} is not exact with positional='rotary': the query-key "
                         "score then depends on the positions of query and key, not on W_Q W_K^T alone")
    if cfg.qk_norm is not None:
        raise ValueError(f"{step} is not exact with qk_norm={cfg.qk_norm!r}: the q/k RMSNorms act on x @ W_Q + b_Q "
                         "and x @ W_K + b_K themselves (a mean square and a weight per coordinate), so "
                         "refactored factors with the same product W_Q W_K^T give other scores")
    if cfg.n_key_value_heads != cfg.n_heads:
        raise ValueError(f"{step} refactors each head's W_Q W_K^T and W_V W_O, but with n_key_value_heads="
                         f"{cfg.n_key_value_heads} < n_heads={cfg.n_heads} each kv head's W_K and W_V are shared by "
                         f"{cfg.n_kv_groups} query heads: no single refactored W_K, W_V fits all of them")
    sd = fold_value_biases(state_dict, cfg)
    with _one_cpu_thread():
        _refactor_layers(sd, cfg)
    return sd


def _refactor_layers(sd: dict, cfg: Config) -> None:
    for L in range(cfg.n_layers):
        a = f"blocks.{L}.attn."
        W_Q, W_K, W_V, W_O = (sd[a + k] for k in ("W_Q", "W_K", "W_V", "W_O"))
        b_Q, b_K = sd.get(a + "b_Q"), sd.get(a + "b_K")
        if (b_Q is None) != (b_K is None):
            raise ValueError(f"{a}b_Q and {a}b_K must both be present or both absent")
        dtype = W_Q.dtype
        as64 = lambda t: None if t is None else t.double()  # noqa: E731
        q, k, bq, bk = _refactor_qk(as64(W_Q), as64(W_K), as64(b_Q), as64(b_K))
        U, S, V = _svd_of_product(W_V.double(), W_O.double())
        sd[a + "W_Q"], sd[a + "W_K"] = q.to(dtype), k.to(dtype)
        if bq is not None:
            sd[a + "b_Q"], sd[a + "b_K"] = bq.to(dtype), bk.to(dtype)
        sd[a + "W_V"], sd[a + "W_O"] = (U * S[:, None, :]).to(dtype), V.transpose(-2, -1).to(dtype)


FUNCTIONS = {"fold_ln": fold_ln, "center_reader_weights": center_reader_weights,
             "center_writing_weights": center_writing_weights, "center_unembed": center_unembed,
             "fold_value_biases": fold_value_biases,
             "refactor_factored_attn_matrices": refactor_factored_attn_matrices}


def config_for(state_dict: Mapping[str, Tensor], cfg: Config) -> Config:
    """The Config of a processed state dict: untied when it has W_U_T, with b_U when it has one, with
    attn_out_bias when fold_value_biases gave the attention a b_O. Nothing else changes (fold_ln keeps
    norm_weight_offset: its folded norms hold w = 1 - offset)."""
    changes = dict(tied_unembed="unembed.W_U_T" not in state_dict, unembed_bias="unembed.b_U" in state_dict)
    if cfg.n_layers and "blocks.0.attn.b_O" in state_dict:
        changes["attn_out_bias"] = True
    return cfg.replace(**changes)


def process_state_dict(state_dict: Mapping[str, Tensor], cfg: Config, steps) -> tuple:
    """(state dict, Config) after ``steps`` (names from ALL_STEPS), applied in the order of ALL_STEPS."""
    unknown = [s for s in steps if s not in FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown processing step(s) {unknown}; the steps are {', '.join(ALL_STEPS)}")
    sd = dict(state_dict)
    for step in ALL_STEPS:
        if step in steps:
            sd = FUNCTIONS[step](sd, cfg)
    return sd, config_for(sd, cfg)


def process(model: HookedTransformer, fold_ln: bool = False, center_writing_weights: bool = False,
            center_unembed: bool = False, fold_value_biases: bool = False, center_reader_weights: bool = False,
            refactor_factored_attn_matrices: bool = False) -> HookedTransformer:
    """A new model with the chosen steps applied (in the order of ALL_STEPS), recorded on ``.processing``.

    Steps already in ``model.processing`` are skipped; the model passed in is not changed.
    """
    chosen = dict(fold_ln=fold_ln, center_reader_weights=center_reader_weights,
                  center_writing_weights=center_writing_weights, center_unembed=center_unembed,
                  fold_value_biases=fold_value_biases, refactor_factored_attn_matrices=refactor_factored_attn_matrices)
    todo = [step for step in ALL_STEPS if chosen[step] and step not in model.processing]
    sd, cfg = process_state_dict({k: v.detach() for k, v in model.state_dict().items()}, model.cfg, todo)
    first = next(model.parameters())
    flags = HookFlags(**model.hook_flags.as_dict())  # the processed model's own copy of the flags
    out = HookedTransformer(cfg, tokenizer=model._tokenizer, init=False, device=first.device, dtype=first.dtype,
                            hook_flags=flags)
    out.load_state_dict(sd, strict=True)
    out.processing = tuple(step for step in ALL_STEPS if step in model.processing or step in todo)
    return out.train(model.training)
