"""HOOK_SHAPES: every hook point's name pattern, shape and meaning, in forward order.

``{L}`` stands for the layer index. Docs and tests read this table, so it cannot go stale: a test
checks every cached activation's shape against it. Axis names are the project's one vocabulary:
batch pos query_pos key_pos head kv_head d_model d_head d_q d_kv d_mlp d_vocab layer.

Some hooks exist only under some options (a model's ``hook_dict`` is the truth for that model):
hook_pos_embed not with rotary positions; hook_rot_q/hook_rot_k only with them; hook_pre_linear only
in a gated MLP; mlp.hook_mid and mlp.ln's hooks only with mlp_ln; hook_resid_mid not in parallel blocks, ln2 not in one-norm (GPT-J) parallel blocks;
ln2, the MLP's hooks and hook_resid_mid not in attention-only blocks; ln_final not in post-norm models. "ln" hooks belong to LayerNorm or
RMSNorm alike.

Flag-gated hooks (``FLAG_GATED_HOOKS``: pattern -> the HookFlags field that turns it on, see
``hook_flags.py``) are in a model's ``hook_dict`` only while their flag is on. Under use_attn_in or
use_split_qkv_input ln1 normalises one input per head, so its hooks gain a head axis before the last
(``hook_shape(name, flags)``: ln1.hook_scale [batch pos head 1], ln1.hook_normalized and ln1.hook_out
[batch pos head d_model]), as in TransformerLens; under use_split_qkv_input ln1 runs three times (q,
k, then v inputs), and a cache keeps the last (v's: [batch pos kv_head ..] with grouped-query attention).

Families (``hook_shape(name, flags, cfg)`` gives one model's shapes): with grouped-query attention
(cfg.n_key_value_heads < n_heads) hook_k, hook_v, hook_rot_k, k_norm's hooks and the split
hook_k_input/hook_v_input have the ``kv_head`` axis (size n_key_value_heads) instead of ``head``,
unless cfg.ungroup_grouped_query_attention (or use_attn_in, whose per-query-head inputs give per-query-head
keys); q_norm/k_norm hooks exist with cfg.qk_norm: per head [batch pos head d_head] ("head"), or over
all heads together ("full", OLMo 2: [batch pos d_q] and [batch pos d_kv], d_q = head * d_head,
d_kv = kv_head * d_head); ln1_post/ln2_post with norm_placement "sandwich"; unembed.hook_pre_cap
with cfg.output_logits_soft_cap. ``axis_sizes(cfg, batch, pos)`` sizes every axis name.
"""

import re

HOOK_SHAPES = {
    "hook_embed": ("batch pos d_model", "token embedding W_E[tokens]"),
    "hook_pos_embed": ("batch pos d_model", "position embedding W_pos[positions], learned or sinusoidal"),
    "blocks.{L}.hook_resid_pre": ("batch pos d_model", "residual stream entering block L"),
    "blocks.{L}.hook_attn_in": ("batch pos head d_model",
                                "use_attn_in only: a copy of resid_pre per head, read by ln1 then q, k and v"),
    "blocks.{L}.hook_q_input": ("batch pos head d_model",
                                "use_split_qkv_input only: a copy of resid_pre per head, read by ln1 then q"),
    "blocks.{L}.hook_k_input": ("batch pos kv_head d_model",
                                "use_split_qkv_input only: a copy of resid_pre per head, read by ln1 then k"),
    "blocks.{L}.hook_v_input": ("batch pos kv_head d_model",
                                "use_split_qkv_input only: a copy of resid_pre per head, read by ln1 then v"),
    "blocks.{L}.ln1.hook_scale": ("batch pos 1", "ln1 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln1.hook_normalized": ("batch pos d_model", "ln1's (x - mean) / scale, RMS: x / scale; before w and b"),
    "blocks.{L}.ln1.hook_out": ("batch pos d_model", "ln1 output normalized * w + b, what the attention reads "
                                "(norm_placement 'output': the normalized attention output)"),
    "blocks.{L}.attn.hook_q": ("batch pos head d_head", "queries, x @ W_Q + b_Q"),
    "blocks.{L}.attn.hook_k": ("batch pos kv_head d_head", "keys (kv_head = head without grouped-query attention)"),
    "blocks.{L}.attn.hook_v": ("batch pos kv_head d_head", "values (kv_head = head without grouped-query attention)"),
    "blocks.{L}.attn.q_norm.hook_scale": ("batch pos head 1", "qk_norm only: the query norm's divisor"),
    "blocks.{L}.attn.q_norm.hook_normalized": ("batch pos head d_head", "qk_norm only: queries / scale, before w"),
    "blocks.{L}.attn.q_norm.hook_out": ("batch pos head d_head", "qk_norm only: normalized queries * w, then rotated"),
    "blocks.{L}.attn.k_norm.hook_scale": ("batch pos kv_head 1", "qk_norm only: the key norm's divisor"),
    "blocks.{L}.attn.k_norm.hook_normalized": ("batch pos kv_head d_head", "qk_norm only: keys / scale, before w"),
    "blocks.{L}.attn.k_norm.hook_out": ("batch pos kv_head d_head", "qk_norm only: normalized keys * w, then rotated"),
    "blocks.{L}.attn.hook_rot_q": ("batch pos head d_head", "queries after the rotary rotation"),
    "blocks.{L}.attn.hook_rot_k": ("batch pos kv_head d_head", "keys after the rotary rotation"),
    "blocks.{L}.attn.hook_attn_scores": ("batch head query_pos key_pos",
                                         "q.k * scale (1/sqrt(d_head) unless set), soft-capped if set, causally "
                                         "(and for local layers by window) masked with -inf, before softmax"),
    "blocks.{L}.attn.hook_pattern": ("batch head query_pos key_pos", "attention probabilities"),
    "blocks.{L}.attn.hook_z": ("batch pos head d_head", "pattern-weighted values, before W_O"),
    "blocks.{L}.attn.hook_result": ("batch pos head d_model",
                                    "use_attn_result only: each head's z @ W_O[h]; attn_out = their sum + b_O"),
    "blocks.{L}.ln1_post.hook_scale": ("batch pos 1", "sandwich only: the attention output's norm's divisor"),
    "blocks.{L}.ln1_post.hook_normalized": ("batch pos d_model", "sandwich only: attention output / scale, before w"),
    "blocks.{L}.ln1_post.hook_out": ("batch pos d_model", "sandwich only: the normalized attention output, = hook_attn_out"),
    "blocks.{L}.hook_attn_out": ("batch pos d_model", "attention output written to the residual stream"),
    "blocks.{L}.hook_resid_mid": ("batch pos d_model", "resid_pre + attn_out; post-norm: ln1 of that"),
    "blocks.{L}.hook_mlp_in": ("batch pos d_model",
                               "use_hook_mlp_in only: a copy of resid_mid, read by ln2 (post-norm: by the MLP)"),
    "blocks.{L}.ln2.hook_scale": ("batch pos 1", "ln2 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln2.hook_normalized": ("batch pos d_model", "ln2's (x - mean) / scale, RMS: x / scale; before w and b"),
    "blocks.{L}.ln2.hook_out": ("batch pos d_model", "ln2 output normalized * w + b, what the MLP reads "
                                "(norm_placement 'output': the normalized MLP output)"),
    "blocks.{L}.mlp.hook_pre": ("batch pos d_mlp", "MLP pre-activation, x @ W_in + b_in; gated: x @ W_gate"),
    "blocks.{L}.mlp.hook_pre_linear": ("batch pos d_mlp", "gated MLP's ungated branch, x @ W_in + b_in"),
    "blocks.{L}.mlp.hook_mid": ("batch pos d_mlp", "mlp_ln only: the activation's output act(pre), read by mlp.ln"),
    "blocks.{L}.mlp.ln.hook_scale": ("batch pos 1", "mlp_ln only: the MLP norm's divisor (over d_mlp)"),
    "blocks.{L}.mlp.ln.hook_normalized": ("batch pos d_mlp", "mlp_ln only: the MLP norm's normalised value, before w and b"),
    "blocks.{L}.mlp.ln.hook_out": ("batch pos d_mlp", "mlp_ln only: the MLP norm's output, = hook_post"),
    "blocks.{L}.mlp.hook_post": ("batch pos d_mlp", "MLP activation output; gated: act(pre) * pre_linear; mlp_ln: "
                                 "the norm's output"),
    "blocks.{L}.ln2_post.hook_scale": ("batch pos 1", "sandwich only: the MLP output's norm's divisor"),
    "blocks.{L}.ln2_post.hook_normalized": ("batch pos d_model", "sandwich only: MLP output / scale, before w"),
    "blocks.{L}.ln2_post.hook_out": ("batch pos d_model", "sandwich only: the normalized MLP output, = hook_mlp_out"),
    "blocks.{L}.hook_mlp_out": ("batch pos d_model", "MLP output written to the residual stream"),
    "blocks.{L}.hook_resid_post": ("batch pos d_model", "resid_mid + mlp_out, leaving block L; post-norm: ln2 of that"),
    "ln_final.hook_scale": ("batch pos 1", "final norm's divisor (as ln1's)"),
    "ln_final.hook_normalized": ("batch pos d_model", "final norm's (x - mean) / scale, RMS: x / scale; before w and b"),
    "ln_final.hook_out": ("batch pos d_model", "final norm's output normalized * w + b"),
    "unembed.hook_in": ("batch pos d_model", "what the unembedding reads: ln_final.hook_out (post-norm: resid_post)"),
    "unembed.hook_pre_cap": ("batch pos d_vocab", "output_logits_soft_cap only: x @ W_U + b_U before the cap"),
    "unembed.hook_out": ("batch pos d_vocab", "the logits, x @ W_U + b_U (soft-capped: cap * tanh(that / cap))"),
}

# Pattern -> the HookFlags field without which the hook point is not in a model's hook_dict.
FLAG_GATED_HOOKS = {
    "blocks.{L}.hook_attn_in": "use_attn_in",
    "blocks.{L}.hook_q_input": "use_split_qkv_input",
    "blocks.{L}.hook_k_input": "use_split_qkv_input",
    "blocks.{L}.hook_v_input": "use_split_qkv_input",
    "blocks.{L}.attn.hook_result": "use_attn_result",
    "blocks.{L}.hook_mlp_in": "use_hook_mlp_in",
}

# In the table but not in a default (GPT-2) model: only rotary or gated-MLP models have these, and the
# flag-gated ones only while their flag is on.
FAMILY_HOOKS = frozenset({"blocks.{L}.attn.hook_rot_q", "blocks.{L}.attn.hook_rot_k", "blocks.{L}.mlp.hook_pre_linear",
                          "unembed.hook_pre_cap"}
                         | {f"blocks.{{L}}.attn.{n}_norm.hook_{h}" for n in "qk" for h in ("scale", "normalized", "out")}
                         | {f"blocks.{{L}}.ln{i}_post.hook_{h}" for i in (1, 2) for h in ("scale", "normalized", "out")}
                         | {"blocks.{L}.mlp.hook_mid"}
                         | {f"blocks.{{L}}.mlp.ln.hook_{h}" for h in ("scale", "normalized", "out")})
NON_DEFAULT_HOOKS = FAMILY_HOOKS | frozenset(FLAG_GATED_HOOKS)
KV_HEAD_HOOKS = frozenset({"blocks.{L}.attn.hook_k", "blocks.{L}.attn.hook_v", "blocks.{L}.attn.hook_rot_k",
                           "blocks.{L}.hook_k_input", "blocks.{L}.hook_v_input"}
                          | {f"blocks.{{L}}.attn.k_norm.hook_{h}" for h in ("scale", "normalized", "out")})

# ln1's hooks, which see one input per head under use_attn_in or use_split_qkv_input.
PER_HEAD_LN1_HOOKS = frozenset({"blocks.{L}.ln1.hook_scale", "blocks.{L}.ln1.hook_normalized",
                                "blocks.{L}.ln1.hook_out"})

_LAYER = re.compile(r"\.(\d+)\.")


def hook_pattern(name: str) -> str:
    """The HOOK_SHAPES key of a concrete hook name: 'blocks.3.attn.hook_q' -> 'blocks.{L}.attn.hook_q'."""
    return _LAYER.sub(".{L}.", name, count=1)


def hook_shape(name: str, flags=None, cfg=None) -> str:
    """The shape string of a concrete hook name; KeyError for a name not in the table.

    ``flags`` (a HookFlags; None: all off) and ``cfg`` (a Config; None: pre-norm) give the shape for one
    model: ln1's hooks gain the head axis under use_attn_in or use_split_qkv_input in a pre-norm block
    (a post-norm ln1 reads resid_pre + attn_out, never the per-head inputs).
    """
    pattern = hook_pattern(name)
    if pattern not in HOOK_SHAPES:
        from ..suggest import did_you_mean

        raise KeyError(f"{name!r} is not a hook name of HOOK_SHAPES (its pattern {pattern!r} is not in the table)"
                       + did_you_mean(pattern, HOOK_SHAPES))
    shape = HOOK_SHAPES[pattern][0]
    per_head = flags is not None and (flags.use_attn_in or flags.use_split_qkv_input)
    if per_head and pattern in PER_HEAD_LN1_HOOKS and getattr(cfg, "norm_placement", "pre") in ("pre", "sandwich"):
        *lead, last = shape.split()
        # under use_split_qkv_input the last ln1 run is the values' input: one per kv head
        grouped = flags.use_split_qkv_input and _grouped(cfg, flags, "input")
        shape = " ".join([*lead, "kv_head" if grouped else "head", last])
    if pattern in KV_HEAD_HOOKS and not _grouped(cfg, flags, pattern):
        shape = shape.replace("kv_head", "head")
    if getattr(cfg, "qk_norm", None) == "full" and (".attn.q_norm." in pattern or ".attn.k_norm." in pattern):
        width = "d_q" if ".q_norm." in pattern else "d_kv"
        shape = "batch pos 1" if pattern.endswith("hook_scale") else f"batch pos {width}"
    return shape


def _grouped(cfg, flags, pattern: str) -> bool:
    """Whether this hook has the kv_head axis (fewer heads than the queries) in this model."""
    if cfg is None or _kv_heads(cfg) == cfg.n_heads or cfg.ungroup_grouped_query_attention:
        return False
    if flags is not None and flags.use_attn_in and "input" not in pattern:
        return False  # each query head's own input gives each query head its own keys and values
    return True


def _kv_heads(cfg) -> int:
    # a TransformerLens-style config reads None for "as many as the query heads"
    return cfg.n_key_value_heads or cfg.n_heads


def axis_sizes(cfg, batch: int, pos: int) -> dict:
    """Every axis name of HOOK_SHAPES -> its size in a model of ``cfg`` run on [batch pos] tokens."""
    kv_heads = _kv_heads(cfg)
    return {"batch": batch, "pos": pos, "query_pos": pos, "key_pos": pos, "head": cfg.n_heads,
            "kv_head": kv_heads, "d_model": cfg.d_model, "d_head": cfg.d_head, "d_mlp": cfg.d_mlp,
            "d_vocab": cfg.d_vocab, "d_q": cfg.n_heads * cfg.d_head, "d_kv": kv_heads * cfg.d_head,
            "layer": cfg.n_layers}
