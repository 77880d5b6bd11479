"""glassbox.tl's standalone components against TransformerLens 3.9's: Attention, GroupedQueryAttention,
MLP, GatedMLP, the ALiBi tables, xIELU and the attention projections.

Each pair is built from the same config, TransformerLens's seeded weights are loaded into glassbox's
module (TransformerLens's state dict, unchanged), and the outputs and every hook are compared.
Sizes are distinct (d_model 30, 5 heads of d_head 6, 7 positions) so a swapped axis cannot pass.
"""

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.components import AbstractAttention as TLAbstract
from transformer_lens.components import Attention as TLAttention
from transformer_lens.components import GatedMLP as TLGatedMLP
from transformer_lens.components import GroupedQueryAttention as TLGQA
from transformer_lens.components.mlps.mlp import MLP as TLMLP
from transformer_lens.utilities import activation_functions as tl_act
from transformer_lens.utilities.attention import complex_attn_linear, simple_attn_linear

import os

C = gtl.components
MEASURE = os.environ.get("GLASSBOX_MEASURE")  # set: print each comparison's largest relative delta
ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
BASE = dict(n_layers=2, d_model=30, n_ctx=16, d_head=6, n_heads=5, act_fn="relu")
# Bounds on max |delta| / max(1, max |theirs|) over every hook and the output, from the largest measured
# (CPU, torch 2.13; GLASSBOX_MEASURE=1 -s prints them): float32 6.9e-7, float64 1.3e-15; 10x headroom.
BOUND = {torch.float32: 7e-6, torch.float64: 2e-14}


def seeded(module, seed: int = 0, scale: float = 0.5):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(scale * torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype))
    return module


def inputs(*shape, seed: int = 1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def run_hooked(module, names, *args, **kwargs):
    seen = {}
    for n in names:  # the hook points' own API (a glassbox attention runs its fused kernel when none is attached)
        getattr(module, n).add_hook(lambda t, hook, n=n: seen.__setitem__(n, t.detach().clone()))
    try:
        out = module(*args, **kwargs)
    finally:
        for n in names:
            getattr(module, n).remove_hooks("fwd")
    return out, seen


def max_delta(a, b) -> float:
    """max |a - b| over the finite entries, relative to the largest |b| (at least 1)."""
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite), "masked (-inf) entries differ"
    if not finite.any():
        return 0.0
    return ((a[finite] - b[finite]).abs().max() / b[finite].abs().max().clamp(min=1)).item()


def compare(ours, theirs, names, *args, bound, rows=None, **kwargs):
    """Outputs and hooks equal within ``bound``; ``rows`` (a [batch pos] bool) limits them to those queries."""
    out, seen = run_hooked(ours, names, *args, **kwargs)
    want, expected = run_hooked(theirs, names, *args, **kwargs)
    deltas = {}
    for name in ("out",) + tuple(names):
        a, b = (out, want) if name == "out" else (seen[name], expected[name])
        assert a.shape == b.shape, (name, a.shape, b.shape)
        if rows is not None and name in ("out", "hook_z"):
            a, b = a[rows], b[rows]
        elif rows is not None and name in ("hook_attn_scores", "hook_pattern"):
            a, b = a.transpose(1, 2)[rows], b.transpose(1, 2)[rows]
        deltas[name] = max_delta(a, b)
        assert deltas[name] <= bound, (name, deltas[name])
    if MEASURE:
        print(MEASURE, sorted(deltas.items(), key=lambda kv: -kv[1])[0])
    return deltas


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use_attn_result", [False, True])
def test_attention_matches_transformer_lens(dtype, use_attn_result):
    cfg = dict(BASE, dtype=dtype, use_attn_result=use_attn_result)
    theirs = seeded(TLAttention(cfg))
    ours = C.Attention(cfg)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    q, k, v = (inputs(3, 7, 30, seed=s, dtype=dtype) for s in (1, 2, 3))  # three different inputs
    names = ATTN_HOOKS + (("hook_result",) if use_attn_result else ())
    compare(ours, theirs, names, q, k, v, bound=BOUND[dtype])


def test_attention_per_head_inputs_match():
    cfg = dict(BASE, use_split_qkv_input=True)
    theirs = seeded(TLAttention(cfg))
    ours = C.Attention(cfg)
    ours.load_state_dict(theirs.state_dict())
    q, k, v = (inputs(2, 7, 5, 30, seed=s) for s in (4, 5, 6))
    compare(ours, theirs, ATTN_HOOKS, q, k, v, bound=BOUND[torch.float32])


def test_attention_layer_scale_and_local_window_match():
    cfg = dict(BASE, scale_attn_by_inverse_layer_idx=True, window_size=3)
    theirs = seeded(TLAttention(cfg, attn_type="local", layer_id=1))
    ours = C.Attention(cfg, attn_type="local", layer_id=1)
    ours.load_state_dict(theirs.state_dict())
    x = inputs(2, 7, 30)
    deltas = compare(ours, theirs, ATTN_HOOKS, x, x, x, bound=BOUND[torch.float32])
    assert deltas["out"] <= BOUND[torch.float32]
    with pytest.raises(ValueError, match="layer_id"):
        C.Attention(cfg, attn_type="local")  # the inverse-layer scale needs the layer


def test_attention_padding_mask_matches_on_real_queries():
    theirs = seeded(TLAttention(BASE))
    ours = C.Attention(BASE)
    ours.load_state_dict(theirs.state_dict())
    x = inputs(2, 7, 30)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, :3] = 0  # left padding: queries 0..2 of row 0 have no key, which TransformerLens gives a zero pattern
    mask[1, 5:] = 0  # right padding
    rows = mask.bool()  # pad queries attend to themselves in glassbox (their outputs are never read)
    compare(ours, theirs, ATTN_HOOKS[3:], x, x, x, bound=BOUND[torch.float32], attention_mask=mask, rows=rows)


def test_attention_additive_mask_of_zeros_and_minus_inf_matches():
    theirs = seeded(TLAttention(BASE))
    ours = C.Attention(BASE)
    ours.load_state_dict(theirs.state_dict())
    x = inputs(2, 7, 30)
    additive = torch.zeros(2, 1, 1, 7)
    additive[1, ..., 1] = float("-inf")
    compare(ours, theirs, ATTN_HOOKS, x, x, x, bound=BOUND[torch.float32], additive_attention_mask=additive)
    with pytest.raises(ValueError, match="additive_attention_mask"):
        ours(x, x, x, additive_attention_mask=torch.full((2, 1, 1, 7), -10000.0))  # BERT's finite mask: a bias


def test_attention_with_a_key_value_cache_entry_matches():
    theirs = seeded(TLAttention(BASE))
    ours = C.Attention(BASE)
    ours.load_state_dict(theirs.state_dict())
    x = inputs(2, 7, 30)
    their_entry = TransformerLensKeyValueCacheEntry.init_cache_entry(TL.HookedTransformerConfig(**BASE), "cpu", 2)
    our_entry = gtl.past_key_value_caching.HookedTransformerKeyValueCacheEntry()
    for part in (x[:, :4], x[:, 4:]):  # a prompt, then its continuation reading the cached keys
        out, want = ours(part, part, part, past_kv_cache_entry=our_entry), theirs(part, part, part,
                                                                                 past_kv_cache_entry=their_entry)
        # measured 4.8e-6 on outputs up to 19 (2.6e-7 relative); keys 7.2e-7
        assert (out - want).abs().max().item() <= BOUND[torch.float32] * want.abs().max().item()
    assert (our_entry.past_keys - their_entry.past_keys).abs().max().item() <= 7e-6


@pytest.mark.parametrize("ungroup", [False, True])
def test_grouped_query_attention_matches_transformer_lens(ungroup):
    cfg = dict(BASE, d_model=30, n_heads=6, d_head=5, n_key_value_heads=2, ungroup_grouped_query_attention=ungroup)
    theirs = seeded(TLGQA(cfg))
    ours = C.GroupedQueryAttention(cfg)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    q, k, v = (inputs(2, 7, 30, seed=s) for s in (1, 2, 3))
    compare(ours, theirs, ATTN_HOOKS, q, k, v, bound=BOUND[torch.float32])
    for name in ("W_K", "W_V", "b_K", "b_V"):  # repeated per query head, as TransformerLens's properties
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours._W_K.shape == (2, 30, 5)


def test_components_are_instances_for_a_models_own_modules():
    model = gtl.HookedTransformer(gtl.HookedTransformerConfig(**BASE, d_vocab=11, n_key_value_heads=None))
    grouped = gtl.HookedTransformer(gtl.HookedTransformerConfig(**dict(BASE, n_heads=6, d_head=5), d_vocab=11,
                                                                n_key_value_heads=2, gated_mlp=True))
    assert isinstance(model.blocks[0].attn, C.Attention) and not isinstance(model.blocks[0].attn, C.GroupedQueryAttention)
    assert isinstance(grouped.blocks[0].attn, C.GroupedQueryAttention) and not isinstance(grouped.blocks[0].attn, C.Attention)
    assert isinstance(model.blocks[0].attn, C.AbstractAttention)
    assert isinstance(model.blocks[0].mlp, C.MLP) and not isinstance(model.blocks[0].mlp, C.GatedMLP)
    assert isinstance(grouped.blocks[0].mlp, C.GatedMLP) and isinstance(grouped.blocks[0].mlp, C.CanBeUsedAsMLP)


@pytest.mark.parametrize("act_fn", ["relu", "gelu", "silu", "gelu_new", "gelu_fast"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mlp_matches_transformer_lens(act_fn, dtype):
    cfg = dict(BASE, d_mlp=44, act_fn=act_fn, dtype=dtype)
    theirs = seeded(TLMLP(cfg))
    ours = C.MLP(cfg)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    # measured (relative) float32 4.2e-8 (gelu_new: the fused kernel against TransformerLens's formula; 0 for
    # the others), float64 7.9e-17
    compare(ours, theirs, ("hook_pre", "hook_post"), inputs(3, 7, 30, dtype=dtype), bound=BOUND[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gated_mlp_adds_b_in_after_the_product_as_transformer_lens(dtype):
    cfg = dict(BASE, d_mlp=44, act_fn="silu", dtype=dtype)
    theirs = seeded(TLGatedMLP(cfg))  # b_in nonzero: the two bias placements differ by ~1 here
    ours = C.GatedMLP(cfg)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert sorted(dict(ours.named_parameters())) == ["W_gate", "W_in", "W_out", "b_in", "b_out"]
    compare(ours, theirs, ("hook_pre", "hook_pre_linear", "hook_post"), inputs(3, 7, 30, dtype=dtype), bound=BOUND[dtype])


def test_gated_model_with_b_in_matches_transformer_lens():
    """A whole HookedTransformer with a gated MLP: TransformerLens's weights, glassbox.tl's model."""
    cfg = dict(BASE, d_vocab=23, act_fn="silu", gated_mlp=True, d_mlp=44)
    theirs = seeded(TL.HookedTransformer(TL.HookedTransformerConfig(**cfg), move_to_device=False), scale=0.3)
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**cfg))
    ours.load_and_process_state_dict(theirs.state_dict(), fold_ln=False, center_writing_weights=False,
                                     center_unembed=False, fold_value_biases=False)
    tokens = torch.tensor([[1, 5, 7, 9, 2, 22, 0]])
    logits, cache = ours.run_with_cache(tokens)
    want, their_cache = theirs.run_with_cache(tokens)
    # measured: logits 4.8e-7 (of up to 1.8), hook_post 4.8e-7; with b_in before the product (glassbox.tl's
    # model before) this test measured 0.72
    assert (logits - want).abs().max().item() <= 5e-6
    for L in range(2):
        name = f"blocks.{L}.mlp.hook_post"
        assert (cache[name] - their_cache[name]).abs().max().item() <= 5e-6, name


def test_alibi_tables_match_transformer_lens():
    for n_heads, n_ctx in ((2, 4), (5, 9), (8, 17), (12, 3)):
        ours, theirs = C.AbstractAttention.create_alibi_bias(n_heads, n_ctx), TLAbstract.create_alibi_bias(n_heads, n_ctx)
        # measured max |delta| 6.0e-8 (float64 multipliers rounded once against their float32 powers: one
        # float32 ulp, 1.2e-7 relative, at most)
        torch.testing.assert_close(ours, theirs, atol=0, rtol=3e-7)
        assert torch.equal(C.AbstractAttention.create_alibi_slope(n_ctx), TLAbstract.create_alibi_slope(n_ctx))


def test_xielu_matches_transformer_lens():
    x = torch.linspace(-6, 4, 101)
    assert torch.equal(gtl.utils.xielu(x), tl_act.xielu(x))
    for init in ({}, dict(alpha_p_init=1.3, alpha_n_init=0.9, beta_init=0.2, eps=-1e-4)):
        ours, theirs = gtl.utils.XIELU(**init), tl_act.XIELU(**init)
        # parameters: float64 softplus-inverse rounded once against theirs in float32; measured 6.0e-8
        torch.testing.assert_close(ours.alpha_p, theirs.alpha_p, atol=2e-7, rtol=0)
        ours.load_state_dict(theirs.state_dict())
        assert torch.equal(ours(x), theirs(x))


def test_attention_projections_match_transformer_lens():
    w, b = inputs(5, 30, 6, seed=2), inputs(5, 6, seed=3)
    x3, x4 = inputs(2, 7, 30), inputs(2, 7, 5, 30)
    # measured 0 and 0 (values up to ~10); the bound allows another GEMM's summation order
    assert (gtl.utils.simple_attn_linear(x3, w, b) - simple_attn_linear(x3, w, b)).abs().max().item() <= 5e-6
    assert (gtl.utils.complex_attn_linear(x4, w, b) - complex_attn_linear(x4, w, b)).abs().max().item() <= 5e-6
