"""HOOK_SHAPES: every hook point's name pattern, shape and meaning, in forward order.

``{L}`` stands for the layer index. Docs and tests read this table, so it cannot go stale: a test
checks every cached activation's shape against it. Axis names are the project's one vocabulary:
batch pos query_pos key_pos head d_model d_head d_mlp d_vocab layer.

Some hooks exist only under some options (a model's ``hook_dict`` is the truth for that model):
hook_pos_embed not with rotary positions; hook_rot_q/hook_rot_k only with them; hook_pre_linear only
in a gated MLP; hook_resid_mid and ln2 not in parallel blocks; ln_final not in post-norm models.
"ln" hooks belong to LayerNorm or RMSNorm alike.
"""

import re

HOOK_SHAPES = {
    "hook_embed": ("batch pos d_model", "token embedding W_E[tokens]"),
    "hook_pos_embed": ("batch pos d_model", "position embedding W_pos[positions], learned or sinusoidal"),
    "blocks.{L}.hook_resid_pre": ("batch pos d_model", "residual stream entering block L"),
    "blocks.{L}.ln1.hook_scale": ("batch pos 1", "ln1 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln1.hook_normalized": ("batch pos d_model", "ln1 output, after w and b"),
    "blocks.{L}.attn.hook_q": ("batch pos head d_head", "queries"),
    "blocks.{L}.attn.hook_k": ("batch pos head d_head", "keys"),
    "blocks.{L}.attn.hook_v": ("batch pos head d_head", "values"),
    "blocks.{L}.attn.hook_rot_q": ("batch pos head d_head", "queries after the rotary rotation"),
    "blocks.{L}.attn.hook_rot_k": ("batch pos head d_head", "keys after the rotary rotation"),
    "blocks.{L}.attn.hook_attn_scores": ("batch head query_pos key_pos",
                                         "q.k / sqrt(d_head), causally masked with -inf, before softmax"),
    "blocks.{L}.attn.hook_pattern": ("batch head query_pos key_pos", "attention probabilities"),
    "blocks.{L}.attn.hook_z": ("batch pos head d_head", "pattern-weighted values, before W_O"),
    "blocks.{L}.hook_attn_out": ("batch pos d_model", "attention output written to the residual stream"),
    "blocks.{L}.hook_resid_mid": ("batch pos d_model", "resid_pre + attn_out; post-norm: ln1 of that"),
    "blocks.{L}.ln2.hook_scale": ("batch pos 1", "ln2 divisor sqrt(var + eps), RMS: sqrt(mean(x^2) + eps)"),
    "blocks.{L}.ln2.hook_normalized": ("batch pos d_model", "ln2 output, after w and b"),
    "blocks.{L}.mlp.hook_pre": ("batch pos d_mlp", "MLP pre-activation, x @ W_in + b_in; gated: x @ W_gate"),
    "blocks.{L}.mlp.hook_pre_linear": ("batch pos d_mlp", "gated MLP's ungated branch, x @ W_in + b_in"),
    "blocks.{L}.mlp.hook_post": ("batch pos d_mlp", "MLP activation output; gated: act(pre) * pre_linear"),
    "blocks.{L}.hook_mlp_out": ("batch pos d_model", "MLP output written to the residual stream"),
    "blocks.{L}.hook_resid_post": ("batch pos d_model", "resid_mid + mlp_out, leaving block L; post-norm: ln2 of that"),
    "ln_final.hook_scale": ("batch pos 1", "final norm's divisor (as ln1's)"),
    "ln_final.hook_normalized": ("batch pos d_model", "final norm's output, fed to the unembedding"),
}

# In the table but not in a default (GPT-2) model: only rotary or gated-MLP models have these.
NON_DEFAULT_HOOKS = frozenset({"blocks.{L}.attn.hook_rot_q", "blocks.{L}.attn.hook_rot_k",
                               "blocks.{L}.mlp.hook_pre_linear"})

_LAYER = re.compile(r"\.(\d+)\.")


def hook_pattern(name: str) -> str:
    """The HOOK_SHAPES key of a concrete hook name: 'blocks.3.attn.hook_q' -> 'blocks.{L}.attn.hook_q'."""
    return _LAYER.sub(".{L}.", name, count=1)


def hook_shape(name: str) -> str:
    """The shape string of a concrete hook name; KeyError for a name not in the table."""
    return HOOK_SHAPES[hook_pattern(name)][0]
