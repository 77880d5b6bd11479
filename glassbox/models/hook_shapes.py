"""HOOK_SHAPES: every hook point's name pattern, shape and meaning, in forward order.

``{L}`` stands for the layer index. Docs and tests read this table, so it cannot go stale: a test
checks every cached activation's shape against it. Axis names are the project's one vocabulary:
batch pos query_pos key_pos head d_model d_head d_mlp d_vocab layer.

Some hooks exist only under some options (a model's ``hook_dict`` is the truth for that model):
hook_pos_embed not with rotary positions; hook_rot_q/hook_rot_k only with them; hook_pre_linear only
in a gated MLP; hook_resid_mid and ln2 not in parallel blocks; ln2, the MLP's hooks and hook_resid_mid
not in attention-only blocks; ln_final not in post-norm models. "ln" hooks belong to LayerNorm or
RMSNorm alike.

Flag-gated hooks (``FLAG_GATED_HOOKS``: pattern -> the HookFlags field that turns it on, see
``hook_flags.py``) are in a model's ``hook_dict`` only while their flag is on. Under use_attn_in or
use_split_qkv_input ln1 normalises one input per head, so its hooks gain a head axis before the last
(``hook_shape(name, flags)``: ln1.hook_scale [batch pos head 1], ln1.hook_normalized and ln1.hook_out
[batch pos head d_model]), as in TransformerLens; under use_split_qkv_input ln1 runs three times (q,
k, then v inputs), and a cache keeps the last (v's).
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
    "blocks.{L}.hook_k_input": ("batch pos head d_model",
                                "use_split_qkv_input only: a copy of resid_pre per head, read by ln1 then k"),
    "blocks.{L}.hook_v_input": ("batch pos head d_model",
                                "use_split_qkv_input only: a copy of resid_pre per head, read by ln1 then v"),
    "blocks.{L}.ln1.hook_scale": ("batch pos 1", "ln1 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln1.hook_normalized": ("batch pos d_model", "ln1's (x - mean) / scale, RMS: x / scale; before w and b"),
    "blocks.{L}.ln1.hook_out": ("batch pos d_model", "ln1 output normalized * w + b, what the attention reads"),
    "blocks.{L}.attn.hook_q": ("batch pos head d_head", "queries"),
    "blocks.{L}.attn.hook_k": ("batch pos head d_head", "keys"),
    "blocks.{L}.attn.hook_v": ("batch pos head d_head", "values"),
    "blocks.{L}.attn.hook_rot_q": ("batch pos head d_head", "queries after the rotary rotation"),
    "blocks.{L}.attn.hook_rot_k": ("batch pos head d_head", "keys after the rotary rotation"),
    "blocks.{L}.attn.hook_attn_scores": ("batch head query_pos key_pos",
                                         "q.k / sqrt(d_head), causally masked with -inf, before softmax"),
    "blocks.{L}.attn.hook_pattern": ("batch head query_pos key_pos", "attention probabilities"),
    "blocks.{L}.attn.hook_z": ("batch pos head d_head", "pattern-weighted values, before W_O"),
    "blocks.{L}.attn.hook_result": ("batch pos head d_model",
                                    "use_attn_result only: each head's z @ W_O[h]; attn_out = their sum + b_O"),
    "blocks.{L}.hook_attn_out": ("batch pos d_model", "attention output written to the residual stream"),
    "blocks.{L}.hook_resid_mid": ("batch pos d_model", "resid_pre + attn_out; post-norm: ln1 of that"),
    "blocks.{L}.hook_mlp_in": ("batch pos d_model",
                               "use_hook_mlp_in only: a copy of resid_mid, read by ln2 (post-norm: by the MLP)"),
    "blocks.{L}.ln2.hook_scale": ("batch pos 1", "ln2 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln2.hook_normalized": ("batch pos d_model", "ln2's (x - mean) / scale, RMS: x / scale; before w and b"),
    "blocks.{L}.ln2.hook_out": ("batch pos d_model", "ln2 output normalized * w + b, what the MLP reads"),
    "blocks.{L}.mlp.hook_pre": ("batch pos d_mlp", "MLP pre-activation, x @ W_in + b_in; gated: x @ W_gate"),
    "blocks.{L}.mlp.hook_pre_linear": ("batch pos d_mlp", "gated MLP's ungated branch, x @ W_in + b_in"),
    "blocks.{L}.mlp.hook_post": ("batch pos d_mlp", "MLP activation output; gated: act(pre) * pre_linear"),
    "blocks.{L}.hook_mlp_out": ("batch pos d_model", "MLP output written to the residual stream"),
    "blocks.{L}.hook_resid_post": ("batch pos d_model", "resid_mid + mlp_out, leaving block L; post-norm: ln2 of that"),
    "ln_final.hook_scale": ("batch pos 1", "final norm's divisor (as ln1's)"),
    "ln_final.hook_normalized": ("batch pos d_model", "final norm's (x - mean) / scale, RMS: x / scale; before w and b"),
    "ln_final.hook_out": ("batch pos d_model", "final norm's output normalized * w + b"),
    "unembed.hook_in": ("batch pos d_model", "what the unembedding reads: ln_final.hook_out (post-norm: resid_post)"),
    "unembed.hook_out": ("batch pos d_vocab", "the logits, x @ W_U + b_U"),
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
NON_DEFAULT_HOOKS = frozenset({"blocks.{L}.attn.hook_rot_q", "blocks.{L}.attn.hook_rot_k",
                               "blocks.{L}.mlp.hook_pre_linear"}) | frozenset(FLAG_GATED_HOOKS)

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
    shape = HOOK_SHAPES[pattern][0]
    per_head = flags is not None and (flags.use_attn_in or flags.use_split_qkv_input)
    if per_head and pattern in PER_HEAD_LN1_HOOKS and getattr(cfg, "norm_placement", "pre") == "pre":
        *lead, last = shape.split()
        shape = " ".join([*lead, "head", last])
    return shape
