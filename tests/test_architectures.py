"""The architecture options against independent oracles: the textbook sinusoidal formula, a
hand-written post-norm forward pass, rotary rotations as complex multiplication, relative-position
invariance of rotary scores, RMSNorm and SwiGLU by hand, HOOK_SHAPES over every architecture, the
presets, truncated-normal initialisation, and each preset learning a small text.
"""

import math
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glassbox.models import HOOK_SHAPES, Config, HookedTransformer, hook_pattern, hook_shape, preset_config
from glassbox.models.hook_flags import HookFlags
from glassbox.models.hook_shapes import axis_sizes
from glassbox.models.rotary_attention import RotaryAttention

from conftest import perturbed

SIZES = dict(d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19, d_mlp=37)
TEXT = Path(__file__).parent / "data" / "austen_slice.txt"


def record_all(model, tokens, **kwargs):
    acts = {}
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: True, lambda x, hook: acts.__setitem__(hook.name, x))],
                             **kwargs)
    return acts


def tokens_for(cfg, batch=3, pos=11, seed=1):
    return torch.randint(0, cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


# -- sinusoidal positions ------------------------------------------------------------------------
def test_sinusoidal_positions_equal_the_textbook_formula():
    cfg = Config(**SIZES, positional="sinusoidal")
    model = HookedTransformer(cfg)
    tokens = tokens_for(cfg, batch=2, pos=cfg.n_ctx)
    acts = record_all(model, tokens)
    expected = torch.tensor([[math.sin(p / 10000 ** (i / cfg.d_model)) if i % 2 == 0
                              else math.cos(p / 10000 ** ((i - 1) / cfg.d_model)) for i in range(cfg.d_model)]
                             for p in range(cfg.n_ctx)])
    # measured 0 (values up to 1), bound 1e-6 (exact here)
    torch.testing.assert_close(acts["hook_pos_embed"], expected.expand(2, -1, -1), atol=1e-6, rtol=0)
    # measured 0 (values up to 1), bound 1e-6 (exact here)
    torch.testing.assert_close(acts["blocks.0.hook_resid_pre"], acts["hook_embed"] + expected, atol=1e-6, rtol=0)
    assert "pos_embed.W_pos" not in model.state_dict(), "the fixed table is not a trained parameter"


# -- post-norm -----------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_post_norm_model_equals_a_hand_written_forward_pass(tied):
    cfg = preset_config("classic", **SIZES, tied_unembed=tied)
    model = perturbed(cfg)
    tokens = tokens_for(cfg)
    p = {k: v.detach() for k, v in model.named_parameters()}

    def layer_norm(x, w, b):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + cfg.layer_norm_eps) * w + b

    def attention(x, L):
        a = f"blocks.{L}.attn."
        q = torch.einsum("bpd,hde->bhpe", x, p[a + "W_Q"]) + p[a + "b_Q"][None, :, None]
        k = torch.einsum("bpd,hde->bhpe", x, p[a + "W_K"]) + p[a + "b_K"][None, :, None]
        v = torch.einsum("bpd,hde->bhpe", x, p[a + "W_V"]) + p[a + "b_V"][None, :, None]
        scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
        n = x.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        z = scores.softmax(-1) @ v
        return torch.einsum("bhpe,hed->bpd", z, p[a + "W_O"]) + p[a + "b_O"]

    x = p["embed.W_E"][tokens] + model.pos_embed.W_pos[: tokens.shape[1]]
    for L in range(cfg.n_layers):
        b = f"blocks.{L}."
        x = layer_norm(x + attention(x, L), p[b + "ln1.w"], p[b + "ln1.b"])
        mlp = torch.relu(x @ p[b + "mlp.W_in"] + p[b + "mlp.b_in"]) @ p[b + "mlp.W_out"] + p[b + "mlp.b_out"]
        x = layer_norm(x + mlp, p[b + "ln2.w"], p[b + "ln2.b"])
    expected = x @ p["embed.W_E" if tied else "unembed.W_U_T"].T  # no final norm after a post-norm block
    with torch.no_grad():
        # measured 1.3e-14 (values up to 14), bound 1e-10: 7765x
        torch.testing.assert_close(model(tokens), expected, atol=1e-10, rtol=0)
        # measured 5.7e-6 in float32 (logits up to 14.4); bound 5e-5, 9x
        torch.testing.assert_close(model.float()(tokens), expected.float(), atol=5e-5, rtol=0)


# -- rotary --------------------------------------------------------------------------------------
def rotary_attention(style, rotary_dim, seed=0):
    cfg = Config(**SIZES, positional="rotary", rotary_style=style, rotary_dim=rotary_dim, rotary_base=30.0)
    torch.manual_seed(seed)
    attn = RotaryAttention(cfg).double()
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(0.5 * torch.randn_like(param))
    return cfg, attn


def run_attention(attn, x, positions):
    """(rot_q, rot_k, scores) of a hooked attention module on x at the given positions."""
    acts = {}
    handles = [getattr(attn, name).add_hook(lambda t, hook, name=name: acts.__setitem__(name, t))
               for name in ("hook_rot_q", "hook_rot_k", "hook_attn_scores")]
    try:
        attn(x, positions)
    finally:
        for handle in handles:
            handle.remove()
    return acts["hook_rot_q"], acts["hook_rot_k"], acts["hook_attn_scores"]


@pytest.mark.parametrize("style,rotary_dim", [("half", 6), ("interleaved", 6), ("half", 4), ("interleaved", 4)])
def test_rotation_is_complex_multiplication_of_the_pairs(style, rotary_dim):
    cfg, attn = rotary_attention(style, rotary_dim)
    x = torch.randn(2, 7, cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [3, 4, 5, 9, 10, 11, 12]])
    rot_q, _, _ = run_attention(attn, x, positions)
    q = torch.einsum("bpd,hde->bphe", x, attn.W_Q) + attn.b_Q
    r = rotary_dim
    if style == "half":
        real, imag = q[..., : r // 2], q[..., r // 2: r]
    else:
        real, imag = q[..., 0:r:2], q[..., 1:r:2]
    theta = cfg.rotary_base ** (-2 * torch.arange(r // 2, dtype=torch.float64) / r)
    turned = torch.complex(real, imag) * torch.polar(torch.ones((), dtype=torch.float64), positions[..., None, None] * theta)
    if style == "half":
        expected = torch.cat([turned.real, turned.imag, q[..., r:]], dim=-1)
    else:
        expected = torch.cat([torch.stack([turned.real, turned.imag], -1).flatten(-2), q[..., r:]], dim=-1)
    # measured 1.8e-15 (values up to 8.2), bound 1e-12: 563x
    torch.testing.assert_close(rot_q, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rotary_scores_depend_only_on_relative_position(style):
    cfg, attn = rotary_attention(style, 6)
    attn = attn.float()
    x = torch.randn(2, 7, cfg.d_model, generator=torch.Generator().manual_seed(3))
    base = torch.arange(7).expand(2, 7)
    _, _, scores = run_attention(attn, x, base)
    for shift in (1, 5, cfg.n_ctx - 7):
        _, _, shifted = run_attention(attn, x, base + shift)
        # measured 3.8e-6 (float32 scores up to 18.8); bound 4e-5, 10x
        torch.testing.assert_close(shifted, scores, atol=4e-5, rtol=0, msg=lambda m: f"shift {shift}: {m}")
    _, _, stretched = run_attention(attn, x, base * 2)
    finite = torch.isfinite(scores)
    assert (stretched[finite] - scores[finite]).abs().max() > 0.1, "positions must matter, not only be ignored"


def test_rotary_model_with_kv_cache_matches_the_full_forward():
    cfg = preset_config("modern", **SIZES)
    model = perturbed(cfg)
    tokens = tokens_for(cfg, batch=2, pos=12)
    from glassbox.models import KVCache

    cache = KVCache(cfg.n_layers)
    with torch.no_grad():
        full = model(tokens)
        first = model(tokens[:, :5], past_kv_cache=cache)
        rest = [model(tokens[:, i: i + 1], past_kv_cache=cache) for i in range(5, 12)]
    # measured 7.4e-15 (values up to 5.7), bound 1e-10: 13444x
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full, atol=1e-10, rtol=0)


# -- RMSNorm and the gated MLP by hand -----------------------------------------------------------
def test_rms_norm_and_swiglu_by_hand():
    cfg = preset_config("modern", **SIZES)
    model = perturbed(cfg)
    acts = record_all(model, tokens_for(cfg))
    x = acts["blocks.1.hook_resid_mid"]
    ln, mlp = model.blocks[1].ln2, model.blocks[1].mlp
    scale = (x.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps).sqrt()
    # measured 1.8e-15 (values up to 7.8), bound 1e-12: 563x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_scale"], scale, atol=1e-12, rtol=0)
    # before w, as in every TransformerLens version's RMSNorm
    # measured 8.9e-16 (values up to 2.8), bound 1e-12: 1126x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_normalized"], x / scale, atol=1e-12, rtol=0)
    normed = x / scale * ln.w
    # measured 4.4e-16 (values up to 4.1), bound 1e-12: 2252x
    torch.testing.assert_close(acts["blocks.1.ln2.hook_out"], normed, atol=1e-12, rtol=0)
    gate, linear = normed @ mlp.W_gate, normed @ mlp.W_in
    # measured 8.9e-16 (values up to 5.9), bound 1e-12: 1126x
    torch.testing.assert_close(acts["blocks.1.mlp.hook_pre"], gate, atol=1e-12, rtol=0)
    # measured 1.3e-15 (values up to 6.3), bound 1e-12: 751x
    torch.testing.assert_close(acts["blocks.1.mlp.hook_pre_linear"], linear, atol=1e-12, rtol=0)
    post = gate * torch.sigmoid(gate) * linear
    # measured 3.6e-15 (values up to 22), bound 1e-12: 281x
    torch.testing.assert_close(acts["blocks.1.mlp.hook_post"], post, atol=1e-12, rtol=0)
    # measured 6.2e-15 (values up to 19), bound 1e-12: 161x
    torch.testing.assert_close(acts["blocks.1.hook_mlp_out"], post @ mlp.W_out, atol=1e-12, rtol=0)
    # Without a hook on hook_scale the fused kernel runs; it must agree.
    with torch.no_grad():
        # measured 4.4e-16 (values up to 4.1), bound 1e-12: 2252x
        torch.testing.assert_close(model.blocks[1].ln2(x), normed, atol=1e-12, rtol=0)


# -- HOOK_SHAPES over every architecture ---------------------------------------------------------
ARCHITECTURES = {
    "gpt2": preset_config("gpt2", **SIZES),
    "modern": preset_config("modern", **SIZES),
    "classic": preset_config("classic", **SIZES),
    "parallel": preset_config("gpt2", **SIZES, parallel_attn_mlp=True, positional="rotary",
                              rotary_style="interleaved", rotary_dim=4, unembed_bias=True, tied_unembed=False),
    # Gemma-2-like: grouped-query, sandwich norms, per-head q/k norms, soft caps, local and global layers.
    "sandwich gqa": preset_config("modern", **{**SIZES, "n_heads": 4}, n_key_value_heads=2, norm_placement="sandwich",
                                  qk_norm="head", attn_scores_soft_cap=5.0, output_logits_soft_cap=9.0,
                                  attn_types=("local", "global"), window_size=4, norm_weight_offset=1.0,
                                  scale_embed=True),
    # OLMo-2-like: norms on the sublayers' outputs, q/k norms over all heads, grouped-query.
    "output-norm": preset_config("modern", **{**SIZES, "n_heads": 4}, n_key_value_heads=1, norm_placement="output",
                                 qk_norm="full"),
    # GPT-NeoX-like: parallel blocks with two norms, partial rotary.
    "neox": preset_config("gpt2", **SIZES, parallel_attn_mlp=True, parallel_ln2=True, positional="rotary",
                          rotary_dim=4, tied_unembed=False),
    # TransformerLens's SoLU models: SoLU, then a LayerNorm over d_mlp (mlp.hook_mid, mlp.ln's hooks).
    "solu_ln": preset_config("gpt2", **SIZES, act_fn="solu", mlp_ln=True),
}


# Every flag-gated hook fires in one of these (split q/k/v and attn_in cannot be on together).
FLAGGED = {
    "gpt2 split qkv": (ARCHITECTURES["gpt2"], HookFlags(use_attn_result=True, use_split_qkv_input=True,
                                                        use_hook_mlp_in=True)),
    "modern attn_in": (ARCHITECTURES["modern"], HookFlags(use_attn_in=True, use_hook_mlp_in=True)),
    "classic split qkv": (ARCHITECTURES["classic"], HookFlags(use_split_qkv_input=True, use_attn_result=True,
                                                              use_hook_mlp_in=True)),
    "parallel attn_result": (ARCHITECTURES["parallel"], HookFlags(use_attn_result=True)),
    "attn_only split qkv": (preset_config("gpt2", **SIZES, attn_only=True),
                            HookFlags(use_split_qkv_input=True, use_attn_result=True)),
    "sandwich gqa split qkv": (ARCHITECTURES["sandwich gqa"], HookFlags(use_split_qkv_input=True, use_attn_result=True,
                                                                        use_hook_mlp_in=True)),
    "output-norm split qkv": (ARCHITECTURES["output-norm"], HookFlags(use_split_qkv_input=True, use_hook_mlp_in=True)),
    "sandwich gqa attn_in": (ARCHITECTURES["sandwich gqa"], HookFlags(use_attn_in=True)),
    "neox split qkv": (ARCHITECTURES["neox"], HookFlags(use_split_qkv_input=True, use_hook_mlp_in=True)),
    "ungrouped split qkv": (ARCHITECTURES["sandwich gqa"].replace(ungroup_grouped_query_attention=True),
                            HookFlags(use_split_qkv_input=True)),
}


def test_hook_shapes_table_covers_every_architecture_exactly():
    seen = set()
    variants = {arch: (cfg, None) for arch, cfg in ARCHITECTURES.items()} | FLAGGED
    for arch, (cfg, flags) in variants.items():
        model = HookedTransformer(cfg, hook_flags=flags)
        acts = record_all(model, tokens_for(cfg))
        assert set(acts) == set(model.hook_dict), f"{arch}: every hook point must fire"
        sizes = axis_sizes(cfg, 3, 11)
        for name, act in acts.items():
            assert hook_pattern(name) in HOOK_SHAPES, f"{arch}: {name} is not in HOOK_SHAPES"
            expected = tuple(int(ax) if ax.isdigit() else sizes[ax] for ax in hook_shape(name, flags, cfg).split())
            assert tuple(act.shape) == expected, f"{arch}: {name} has shape {tuple(act.shape)}, table says {expected}"
        seen |= {hook_pattern(name) for name in acts}
    assert seen == set(HOOK_SHAPES), f"table entries no architecture has: {set(HOOK_SHAPES) - seen}"


def test_optional_hooks_exist_only_under_their_option():
    names = {arch: {hook_pattern(n) for n in HookedTransformer(cfg).hook_dict} for arch, cfg in ARCHITECTURES.items()}
    assert "blocks.{L}.attn.hook_rot_q" in names["modern"] and "blocks.{L}.attn.hook_rot_q" not in names["gpt2"]
    assert "hook_pos_embed" not in names["modern"] and "hook_pos_embed" in names["classic"]
    assert "blocks.{L}.mlp.hook_pre_linear" in names["modern"] and "blocks.{L}.mlp.hook_pre_linear" not in names["classic"]
    assert "ln_final.hook_normalized" not in names["classic"]
    assert "blocks.{L}.hook_resid_mid" not in names["parallel"] and "blocks.{L}.ln2.hook_scale" not in names["parallel"]
    assert not any("mlp" in n or "ln2" in n or "resid_mid" in n
                   for n in map(hook_pattern, HookedTransformer(FLAGGED["attn_only split qkv"][0]).hook_dict))


# -- presets, config errors, initialisation ------------------------------------------------------
def test_presets_choose_the_documented_components():
    modern = preset_config("modern", d_model=96, n_layers=2, n_heads=4, d_vocab=50, n_ctx=32)
    assert modern.d_mlp == 256 and abs(modern.d_mlp / modern.d_model - 8 / 3) < 0.1
    assert (modern.normalization, modern.positional, modern.rotary_style, modern.rotary_base) == ("RMS", "rotary", "half", 10000.0)
    assert (modern.gated_mlp, modern.act_fn, modern.use_bias, modern.tied_unembed) == (True, "silu", False, False)
    classic = preset_config("classic", d_model=96, n_layers=2, n_heads=4, d_vocab=50, n_ctx=32)
    assert (classic.positional, classic.act_fn, classic.norm_placement, classic.d_mlp) == ("sinusoidal", "relu", "post", 384)
    assert preset_config("gpt2", d_model=96, n_layers=2, n_heads=4, d_vocab=50, n_ctx=32) == Config(
        d_model=96, n_layers=2, n_heads=4, d_vocab=50, n_ctx=32, model_name="gpt2")
    assert preset_config("modern", d_model=96, n_layers=2, n_heads=4, d_mlp=100).d_mlp == 100
    model = HookedTransformer(preset_config("modern", **SIZES))
    assert not any("b_" in name for name, _ in model.named_parameters()), "the modern preset has no biases"
    with pytest.raises(KeyError, match="unknown architecture preset 'llama'; known: gpt2, modern, classic"):
        preset_config("llama")


@pytest.mark.parametrize("fields,message", [
    (dict(parallel_attn_mlp=True, norm_placement="post"), "parallel_attn_mlp=True needs norm_placement='pre'"),
    (dict(positional="rotary", rotary_dim=5), "rotary_dim=5 must be even"),
    (dict(rotary_dim=4), "rotary_dim is set but positional='learned'"),
    (dict(init_scheme="xavier"), "init_scheme must be one of"),
    (dict(normalization="BN"), "normalization must be one of"),
])
def test_config_errors_name_the_option(fields, message):
    with pytest.raises(ValueError, match=message):
        Config(**{**SIZES, **fields})


def test_truncated_normal_initialisation():
    cfg = preset_config("modern", d_model=64, n_layers=2, n_heads=4, d_vocab=300, n_ctx=16)
    torch.manual_seed(0)
    model = HookedTransformer(cfg)
    for name, param in model.named_parameters():
        if name.endswith(".w"):
            assert torch.equal(param, torch.ones_like(param)), name
            continue
        if name == "embed.W_E":
            fans_std = 1.0
        elif name.endswith("W_O"):
            fans_std = math.sqrt(2 / (cfg.n_heads * cfg.d_head + cfg.d_model))
        elif name.endswith(("W_Q", "W_K", "W_V")):
            fans_std = math.sqrt(2 / (cfg.d_model + cfg.n_heads * cfg.d_head))
        else:
            fans_std = math.sqrt(2 / sum(param.shape))
        # A normal truncated at 3 sigma has std 0.9866 sigma.
        assert param.abs().max() <= 3 * fans_std + 1e-6, name
        # Statistical, not rounding: a sample std within 8% of the truncated normal's.
        assert param.std().item() == pytest.approx(0.9866 * fans_std, rel=0.08), name


# -- each preset learns a small text -------------------------------------------------------------
@contextmanager
def shape_checks_off():
    """The suite's runtime shape checks cost ~50x per call; the training loop runs the same forward
    (already checked above and before and after the loop) 200 times, so it runs unchecked."""
    import jaxtyping

    old = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", old)


@pytest.mark.parametrize("preset", ["gpt2", "modern", "classic"])
def test_each_preset_learns_a_small_text(preset):
    text = TEXT.read_text()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    split = int(0.9 * len(ids))
    train, held_out = ids[:split], ids[split:]
    counts = torch.bincount(train, minlength=len(chars)).double()
    probs = counts / counts.sum()
    unigram_entropy = -(probs[probs > 0] * probs[probs > 0].log()).sum().item()

    cfg = preset_config(preset, d_model=48, n_layers=2, n_heads=4, d_vocab=len(chars), n_ctx=64)
    torch.manual_seed(0)
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    starts = torch.arange(0, len(held_out) - cfg.n_ctx, cfg.n_ctx)
    eval_batch = torch.stack([held_out[s: s + cfg.n_ctx] for s in starts])

    def held_out_loss():
        with torch.no_grad():
            return model(eval_batch, return_type="loss").item()

    before = held_out_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    with shape_checks_off():
        for _ in range(200):
            offsets = torch.randint(0, split - cfg.n_ctx, (16,), generator=gen)
            batch = torch.stack([train[o: o + cfg.n_ctx] for o in offsets])
            loss = model(batch, return_type="loss")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    after = held_out_loss()
    assert before > math.log(len(chars)) - 0.5, f"{preset}: an untrained model should be near uniform, got {before:.3f}"
    # Below the unigram entropy: the model must be using the context, not just letter frequencies.
    assert after < unigram_entropy - 0.3, f"{preset}: held-out loss {before:.3f} -> {after:.3f}, unigram {unigram_entropy:.3f}"


def test_grouped_attention_without_the_kernels_own_grouping_gives_the_same_logits(monkeypatch):
    """Before torch 2.5 scaled_dot_product_attention has no enable_gqa: the kv heads are repeated for it."""
    from glassbox.models import attention

    model = perturbed(ARCHITECTURES["output-norm"])  # 4 query heads over 1 kv head
    tokens = tokens_for(model.cfg)
    with torch.no_grad():
        grouped = model(tokens)
        monkeypatch.setattr(attention, "SDPA_GROUPS", False)
        repeated = model(tokens)
    # measured 0 (float64, logits up to 6.1), bound 1e-13 (the kernels may order sums differently)
    torch.testing.assert_close(repeated, grouped, atol=1e-13, rtol=0)
