"""The cache's TransformerLens-era capabilities against identities and hand computations: neuron results
sum to each MLP's output, the full decomposition sums to the stream, norms of it sum to the norm's
output (computed here by hand, not read from a hook), stacks equal torch.stack of their entries, index
forms agree, 0-d tensor layers equal ints, and toggle_autodiff restores the grad mode."""

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassbox import Config, HookedTransformer

CFG = Config(d_model=13, n_layers=3, n_heads=2, d_head=5, d_mlp=19, d_vocab=31, n_ctx=11, init_range=0.2)
CONFIGS = {
    "gpt2": CFG,
    "rms_gated_rotary": CFG.replace(normalization="RMS", gated_mlp=True, act_fn="silu", positional="rotary",
                                    rotary_dim=4, use_bias=False),
    "attn_only": CFG.replace(attn_only=True),
}


def perturbed(cfg: Config, seed: int) -> HookedTransformer:
    """Norm weights and biases moved off 1 and 0, so a dropped w or b shows."""
    torch.manual_seed(seed)
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
                param.copy_((1.0 + 0.3 * noise) if name.endswith(".w") else 0.3 * noise)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def run(request):
    model = perturbed(CONFIGS[request.param], 0)
    tokens = torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return request.param, model, logits, cache


@pytest.fixture(scope="module")
def gpt2():
    model = perturbed(CFG, 3)
    tokens = torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return model, logits, cache


def norm_by_hand(norm, x, affine: bool = True):
    """A norm's output from the stream it reads: (x - mean) / sqrt(var + eps) (RMSNorm: x / rms), then w, b."""
    if type(norm).__name__ == "RMSNorm":
        out = x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        return out * norm.w.detach() if affine else out
    if not affine:
        return F.layer_norm(x, x.shape[-1:], None, None, norm.eps)
    return F.layer_norm(x, x.shape[-1:], norm.w.detach(), norm.b.detach(), norm.eps)


def bias(module, name, d_model):
    value = getattr(module, name, None)
    return value.detach() if value is not None else torch.zeros(d_model)


# -- neurons ----------------------------------------------------------------------------------------
def test_neuron_results_plus_b_out_are_the_mlp_output(run):
    config, model, _, cache = run
    if config == "attn_only":
        with pytest.raises(ValueError, match="attention-only"):
            cache.stack_neuron_results(-1)
        return
    stack, labels = cache.stack_neuron_results(-1, return_labels=True)
    d_mlp = CFG.d_mlp
    assert labels == [f"L{l}N{n}" for l in range(3) for n in range(d_mlp)] and stack.shape == (3 * d_mlp, 2, 7, 13)
    for l in range(3):
        b_out = bias(model.blocks[l].mlp, "b_out", 13)
        # measured 1.2e-7 (values up to 1.1), bound 1.5e-6: 12x
        torch.testing.assert_close(stack[l * d_mlp:(l + 1) * d_mlp].sum(0) + b_out, cache["mlp_out", l],
                                   atol=1.5e-6, rtol=0)
    # One neuron by hand: its activation times its row of W_out.
    post, W_out = cache["post", 1], model.blocks[1].mlp.W_out.detach()
    torch.testing.assert_close(cache.get_neuron_results(1)[..., 4, :], post[..., 4, None] * W_out[4], atol=0, rtol=0)


@pytest.mark.parametrize("neuron_slice, picked", [
    (None, list(range(19))), (3, [3]), ([0, 7, 18], [0, 7, 18]), (slice(2, 12, 3), [2, 5, 8, 11]),
    (np.array([5, 1]), [5, 1]), (torch.tensor([9, 9]), [9, 9]),
    (torch.arange(19) % 6 == 0, [0, 6, 12, 18]), (-1, [18]),
])
def test_neuron_slices_pick_the_named_neurons(gpt2, neuron_slice, picked):
    model, _, cache = gpt2
    stack, labels = cache.stack_neuron_results(2, neuron_slice=neuron_slice, return_labels=True)
    assert labels == [f"L{l}N{n}" for l in range(2) for n in picked]
    full = cache.stack_neuron_results(2)
    rows = [l * 19 + n for l in range(2) for n in picked]
    torch.testing.assert_close(stack, full[rows], atol=0, rtol=0)


def test_neuron_results_index_forms(gpt2):
    model, _, cache = gpt2
    full = cache.get_neuron_results(0)  # [batch pos neuron d_model]
    assert full.shape == (2, 7, 19, 13)
    torch.testing.assert_close(cache.get_neuron_results(0, 5, -1), full[:, -1, 5], atol=0, rtol=0)
    torch.testing.assert_close(cache.get_neuron_results(-3, [1, 2], slice(1, 4)), full[:, 1:4, [1, 2]], atol=0, rtol=0)
    torch.testing.assert_close(cache.get_neuron_results(torch.tensor(0), np.int64(3), "last"), full[:, -1, 3],
                               atol=0, rtol=0)
    p = torch.randn(13, 4, generator=torch.Generator().manual_seed(5))
    # measured 1.8e-7 (values up to 1.2), bound 2e-6: 11x (8.2e-8 for the [d_model] projection)
    torch.testing.assert_close(cache.get_neuron_results(0, project_output_onto=p), full @ p, atol=2e-6, rtol=0)
    torch.testing.assert_close(cache.get_neuron_results(0, project_output_onto=p[:, 0]), full @ p[:, 0],
                               atol=2e-6, rtol=0)


def test_stack_neuron_results_remainder_and_norm(gpt2):
    model, _, cache = gpt2
    stack, labels = cache.stack_neuron_results(2, neuron_slice=[1, 3], incl_remainder=True, return_labels=True)
    assert labels[-1] == "remainder" and len(labels) == 5
    # measured 1.2e-7 (values up to 1.5), bound 1.5e-6: 12x (the remainder is the stream minus the rest)
    torch.testing.assert_close(stack.sum(0), cache["resid_pre", 2], atol=1.5e-6, rtol=0)
    normed = cache.stack_neuron_results(2, neuron_slice=[1, 3], incl_remainder=True, apply_ln=True)
    # measured 4.8e-7 (values up to 3.1), bound 5e-6: 10x
    torch.testing.assert_close(normed.sum(0) + model.blocks[2].ln1.b.detach(),
                               norm_by_hand(model.blocks[2].ln1, cache["resid_pre", 2]), atol=5e-6, rtol=0)
    assert cache.stack_neuron_results(0).shape == (0, 2, 7, 13)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("mlp_input", [False, True])
def test_norm_folded_into_a_projection_equals_norm_then_projection(gpt2, affine, mlp_input):
    model, _, cache = gpt2
    p = torch.randn(13, 3, generator=torch.Generator().manual_seed(6))
    kw = dict(pos_slice=[0, 6], incl_remainder=True, apply_ln=True, affine=affine, mlp_input=mlp_input)
    folded = cache.stack_neuron_results(2, project_output_onto=p, **kw)
    expanded = cache.stack_neuron_results(2, **kw) @ p
    # measured 1.9e-6 (values up to 8.8), bound 2e-5: 11x
    torch.testing.assert_close(folded, expanded, atol=2e-5, rtol=0)


# -- heads ------------------------------------------------------------------------------------------
def test_head_results_with_a_remainder_sum_to_the_stream(run):
    config, model, _, cache = run
    stack, labels = cache.stack_head_results(2, return_labels=True, incl_remainder=True)
    assert labels == ["L0H0", "L0H1", "L1H0", "L1H1", "remainder"]
    # measured 1.2e-7 (values up to 2.1), bound 1.5e-6: 12x
    torch.testing.assert_close(stack.sum(0), cache["resid_pre", 2], atol=1.5e-6, rtol=0)
    empty, labels = cache.stack_head_results(0, return_labels=True)
    assert empty.shape == (0, 2, 7, 13) and labels == []
    only, labels = cache.stack_head_results(0, return_labels=True, incl_remainder=True)
    assert labels == ["remainder"]
    torch.testing.assert_close(only[0], cache["resid_pre", 0], atol=0, rtol=0)
    with_b_O = cache.stack_head_results(-1, incl_remainder=True, incl_b_O=True, return_labels=True)[1]
    assert with_b_O[:3] == ["L0H0", "L0H1", "L0_b_O"] and with_b_O[-1] == "remainder"


def test_compute_head_results_adds_result_entries(run):
    config, model, _, original = run
    cache = type(original)(dict(original.cache_dict), model, original.has_batch_dim)
    assert "blocks.0.attn.hook_result" not in cache
    cache.compute_head_results()
    for l in range(3):
        result = cache["result", l]
        assert result.shape == (2, 7, 2, 13)
        b_O = bias(model.blocks[l].attn, "b_O", 13)
        # measured 6.0e-8 (values up to 1.1), bound 6e-7: 10x
        torch.testing.assert_close(result.sum(-2) + b_O, cache["attn_out", l], atol=6e-7, rtol=0)
    kept = torch.full_like(cache["result", 0], 7.0)
    cache.cache_dict["blocks.0.attn.hook_result"] = kept
    cache.compute_head_results()
    assert cache["result", 0] is kept  # an entry already there is left as it is


def test_head_results_equal_the_forward_pass_hook_result(gpt2):
    """With use_attn_result the forward pass writes each head's result itself; the cache's z @ W_O equals it."""
    model, _, cache = gpt2
    model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, with_results = model.run_with_cache(cache.tokens)
    finally:
        model.set_use_attn_result(False)
    stack = with_results.stack_head_results()
    for l in range(3):
        torch.testing.assert_close(stack[2 * l:2 * l + 2], with_results["result", l].movedim(-2, 0), atol=0, rtol=0)
    cached = with_results["result", 0]
    with_results.compute_head_results()
    assert with_results["result", 0] is cached


# -- the full decomposition ---------------------------------------------------------------------------
@pytest.mark.parametrize("layer, mlp_input", [(None, False), (-1, False), (2, True), (1, False), (0, False)])
def test_full_decomposition_sums_to_the_stream(run, layer, mlp_input):
    config, model, _, cache = run
    if mlp_input and config == "attn_only":
        pytest.skip("no MLP input")
    stack, labels = cache.get_full_resid_decomposition(layer, mlp_input, return_labels=True)
    n = 3 if layer in (None, -1) else layer
    heads = [f"L{l}H{h}" for l in range(n + mlp_input) for h in range(2)]
    neurons = [] if config == "attn_only" else [f"L{l}N{k}" for l in range(n) for k in range(19)]
    embeds = ["embed"] + ([] if config == "rms_gated_rotary" else ["pos_embed"])
    assert labels == heads + neurons + embeds + ["bias"]
    stream = cache["resid_post", 2] if n == 3 else cache["resid_mid" if mlp_input else "resid_pre", n]
    # measured 3.6e-7 (values up to 2.3), bound 4e-6: 11x
    torch.testing.assert_close(stack.sum(0), stream, atol=4e-6, rtol=0)
    if config == "attn_only":
        return
    mlps, labels = cache.get_full_resid_decomposition(layer, mlp_input, expand_neurons=False, return_labels=True)
    assert labels == heads + [f"{l}_mlp_out" for l in range(n)] + embeds + ["bias"]
    torch.testing.assert_close(mlps.sum(0), stream, atol=4e-6, rtol=0)


def test_full_decomposition_through_the_final_norm_is_its_output(run):
    config, model, logits, cache = run
    stack = cache.get_full_resid_decomposition(apply_ln=True)
    final = norm_by_hand(model.ln_final, cache["resid_post", 2])
    ln_b = bias(model.ln_final, "b", 13)
    # measured 7.2e-7 (values up to 3.5), bound 8e-6: 11x (all three sums below)
    torch.testing.assert_close(stack.sum(0) + ln_b, final, atol=8e-6, rtol=0)
    plain = cache.get_full_resid_decomposition()
    scaled = cache.apply_ln_to_stack(plain, incl_bias=True)
    torch.testing.assert_close(scaled.sum(0), final, atol=8e-6, rtol=0)
    # TransformerLens's contract: centring and the cached scale, no w or b.
    bare = cache.apply_ln_to_stack(plain, affine=False)
    torch.testing.assert_close(bare.sum(0), norm_by_hand(model.ln_final, cache["resid_post", 2], affine=False),
                               atol=8e-6, rtol=0)
    with pytest.raises(ValueError, match="incl_bias"):
        cache.apply_ln_to_stack(plain, affine=False, incl_bias=True)


def test_full_decomposition_projection_equals_projecting_after(run):
    config, model, _, cache = run
    p = model.W_U.detach()[:, [3, 5, 8]]
    for apply_ln in (False, True):
        projected = cache.get_full_resid_decomposition(apply_ln=apply_ln, pos_slice=-1, project_output_onto=p)
        after = cache.get_full_resid_decomposition(apply_ln=apply_ln, pos_slice=-1) @ p
        # measured 1.5e-7 (values up to 1.3), bound 1.5e-6: 10x
        torch.testing.assert_close(projected, after, atol=1.5e-6, rtol=0)
    one = cache.get_full_resid_decomposition(pos_slice=-1, project_output_onto=p[:, 0])
    torch.testing.assert_close(one, cache.get_full_resid_decomposition(pos_slice=-1) @ p[:, 0], atol=1.5e-6, rtol=0)


# -- stacks, layers and indices --------------------------------------------------------------------
def test_stack_activation_is_torch_stack_of_the_entries(gpt2):
    model, _, cache = gpt2
    for name, sub in (("pattern", None), ("resid_post", None), ("scale", "ln2"), ("q", "attn")):
        every = torch.stack([cache[name, l, sub] for l in range(3)])
        assert torch.equal(cache.stack_activation(name, sublayer_type=sub), every)
        assert torch.equal(cache.stack_activation(name, 2, sub), every[:2])
        assert torch.equal(cache.stack_activation(name, -2, sub), every[:2])  # -2: the stream entering block 2
        assert torch.equal(cache.stack_activation(name, -1, sub), every)
        assert torch.equal(cache.stack_activation(name, torch.tensor(1), sub), every[:1])
    with pytest.raises(ValueError, match="no blocks"):
        cache.stack_activation("pattern", 0)


def test_0d_tensor_and_negative_layers_equal_ints(gpt2):
    model, _, cache = gpt2
    for t, i in ((torch.tensor(1), 1), (torch.tensor(-1), 2), (np.int64(0), 0)):
        assert torch.equal(cache["pattern", t], cache["pattern", i])
        assert torch.equal(cache.get_neuron_results(t), cache.get_neuron_results(i))
    stacks = [("accumulated_resid", {}), ("decompose_resid", {}), ("stack_head_results", {}),
              ("stack_neuron_results", {}), ("get_full_resid_decomposition", {})]
    for method, kw in stacks:
        call = getattr(cache, method)
        assert torch.equal(call(torch.tensor(2), **kw), call(2, **kw)), method
        assert torch.equal(call(-2, **kw), call(2, **kw)), method  # stream positions: -1 is n_layers
        assert torch.equal(call(-1, **kw), call(3, **kw)), method
    stack = cache.decompose_resid(2)
    assert torch.equal(cache.apply_ln_to_stack(stack, torch.tensor(2)), cache.apply_ln_to_stack(stack, 2))
    assert torch.equal(cache["k1"], cache["blocks.1.attn.hook_k"])
    assert torch.equal(cache["scale2ln1"], cache["blocks.2.ln1.hook_scale"])


@pytest.mark.parametrize("bad, error", [
    (torch.tensor(1.0), TypeError), (torch.tensor([1]), TypeError), (True, TypeError), (1.5, TypeError),
    (4, ValueError), (-5, ValueError),
])
def test_bad_layers_are_named(gpt2, bad, error):
    model, _, cache = gpt2
    with pytest.raises(error, match="layer"):
        cache.stack_head_results(bad)
    with pytest.raises(KeyError, match="layer"):
        cache["pattern", bad]


def test_bad_index_arguments_are_named(gpt2):
    model, _, cache = gpt2
    with pytest.raises(IndexError, match="neuron_slice"):
        cache.get_neuron_results(0, [0, 19])
    with pytest.raises(TypeError, match="pos_slice"):
        cache.decompose_resid(pos_slice=(0, 2))
    with pytest.raises(ValueError, match="bool mask"):
        cache.decompose_resid(pos_slice=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="project_output_onto"):
        cache.stack_neuron_results(1, project_output_onto=torch.ones(12))
    # an int index out of range names the argument and the axis size (torch's select() named neither)
    with pytest.raises(IndexError, match=r"pos_slice index 7 is outside an axis of size 7"):
        cache.decompose_resid(pos_slice=7)
    with pytest.raises(IndexError, match=r"neuron_slice index -20 is outside an axis of size 19"):
        cache.get_neuron_results(0, neuron_slice=-20)
    with pytest.raises(IndexError, match=r"batch_slice index 2 is outside an axis of size 2"):
        cache.apply_slice_to_batch_dim(torch.tensor(2))
    assert torch.equal(cache.decompose_resid(pos_slice=-7), cache.decompose_resid(pos_slice=0))


def test_batch_slice_and_has_batch_dim(gpt2):
    model, logits, cache = gpt2
    stack = cache.decompose_resid()
    full = cache.apply_ln_to_stack(stack)
    torch.testing.assert_close(cache.apply_ln_to_stack(stack, batch_slice=1), full[:, 1], atol=0, rtol=0)
    torch.testing.assert_close(cache.apply_ln_to_stack(stack, batch_slice=[1]), full[:, [1]], atol=0, rtol=0)
    one = stack[:, 0, 2]  # [component d_model]: no batch or pos axis
    torch.testing.assert_close(cache.apply_ln_to_stack(one, pos_slice=2, batch_slice=0, has_batch_dim=False),
                               full[:, 0, 2], atol=0, rtol=0)
    attrs = cache.logit_attrs(stack, 4)
    torch.testing.assert_close(cache.logit_attrs(stack, 4, batch_slice=0), attrs[:, 0], atol=0, rtol=0)


def test_apply_slice_to_batch_dim_picks_sequences(gpt2):
    model, _, cache = gpt2
    for batch_slice, picked in ((1, 1), ([1, 0], [1, 0]), (slice(1, None), slice(1, None)),
                                (torch.tensor([False, True]), [1])):
        part = cache.apply_slice_to_batch_dim(batch_slice)
        assert part.has_batch_dim == (not isinstance(batch_slice, int))
        assert torch.equal(part.tokens, cache.tokens[picked])
        for name in cache:
            assert torch.equal(part[name], cache[name][picked]), name
        torch.testing.assert_close(part.decompose_resid(apply_ln=True), cache.decompose_resid(apply_ln=True)[:, picked],
                                   atol=0, rtol=0)
    with pytest.raises(ValueError, match="no batch axis"):
        cache.apply_slice_to_batch_dim(0).apply_slice_to_batch_dim(0)


def test_remove_batch_dim_keeps_the_identities(gpt2):
    model, _, cache = gpt2
    one = type(cache)({k: v[:1] for k, v in cache.items()}, model).remove_batch_dim()
    stack = one.get_full_resid_decomposition(pos_slice=-1)
    assert stack.shape == (6 + 57 + 3, 13)
    # measured 1.8e-7 (values up to 1.7), bound 2e-6: 11x
    torch.testing.assert_close(stack.sum(0), cache["resid_post", 2][0, -1], atol=2e-6, rtol=0)
    assert one.stack_neuron_results(1, pos_slice=3, incl_remainder=True).shape == (20, 13)


# -- the mapping and global state ------------------------------------------------------------------
def test_cache_dict_is_live_and_views_match(gpt2):
    model, _, original = gpt2
    cache = type(original)(dict(original.cache_dict), model)
    assert list(cache.keys()) == list(cache.cache_dict) and len(cache.values()) == len(cache)
    assert all(cache[k] is v for k, v in cache.items())
    cache.cache_dict["extra"] = torch.zeros(1)
    assert "extra" in cache and "extra" not in original
    with pytest.raises(TypeError, match="cache_dict"):
        cache.cache_dict = [1]


def test_toggle_autodiff_sets_and_restores_grad_mode(gpt2, caplog):
    _, _, cache = gpt2
    was = torch.is_grad_enabled()
    try:
        with caplog.at_level(logging.WARNING):
            cache.toggle_autodiff()
            assert not torch.is_grad_enabled() and not (torch.ones(1, requires_grad=True) * 2).requires_grad
            cache.toggle_autodiff(True)
            assert torch.is_grad_enabled() and (torch.ones(1, requires_grad=True) * 2).requires_grad
        assert caplog.text.count("autodiff") == 2
    finally:
        torch.set_grad_enabled(was)
    assert torch.is_grad_enabled() == was


@pytest.mark.parametrize("flag", ["use_attn_in", "use_split_qkv_input"])
def test_norm_analysis_at_a_per_head_ln1_is_refused_naming_the_flags(flag):
    from glassbox import Config, HookedTransformer as Glassbox

    torch.manual_seed(0)
    model = Glassbox(Config(d_model=16, n_layers=2, n_heads=2, d_vocab=50, n_ctx=16))
    getattr(model, f"set_{flag}")(True)
    _, cache = model.run_with_cache(torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(1)))
    for call in (lambda: cache.decompose_resid(1, apply_ln=True),
                 lambda: cache.stack_head_results(1, apply_ln=True, pos_slice=1),
                 lambda: cache.accumulated_resid(1, apply_ln=True)):
        with pytest.raises(ValueError, match="blocks.1.ln1.hook_scale was cached per head.*use_attn_in"):
            call()
    stack = cache.decompose_resid(None, apply_ln=True)  # the final norm is one norm: still fine
    assert stack.shape[-1] == 16
