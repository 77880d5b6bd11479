"""Interpretability tools on today's families: grouped-query attention, sandwich and output norms,
GPT-NeoX parallel blocks, Gemma's weight offset and soft caps, q/k norms.

Oracles: for patching, a one-patch-per-forward loop of hooked forwards written here (hook_k/hook_v
indexed by their kv_head axis); for path patching, the two hooked forwards of the procedure written
out; for decompositions, the identities resid = sum of the rows (against the cached residual stream),
each layer's rows = its cached hook_attn_out / hook_mlp_out, and the cached norm outputs; for SVD,
the model-level OV circuit (kv heads repeated there, by other code) and an SVD formed here.
Models are float64 with every parameter perturbed, so dropped terms show far above rounding.
"""

import pytest
import torch

from glassbox.interp import (accumulated_bias, all_composition_scores, get_full_resid_decomposition,
                             stack_neuron_results)
from glassbox.interp.patching import (LogitDiff, activation_patch, path_patch, patch_head_every,
                                      patch_head_every_by_pos, patch_head_k, patch_head_q, patch_head_v_by_pos,
                                      patch_head_z)
from glassbox.interp.svd_interpreter import singular_directions
from glassbox.models import Config, HookedTransformer

SIZES = dict(d_model=18, n_layers=3, n_heads=6, d_head=6, d_mlp=13, d_vocab=29, n_ctx=19, init_range=0.3)
ROTARY = dict(positional="rotary", rotary_dim=4, normalization="RMS", gated_mlp=True, act_fn="silu")
BATCH, SEQ = 2, 5
ATOL = 1e-13  # float64 throughout: the largest error of every comparison here measured 9.8e-15 (a patched metric; values up to 22): 10x


def build(seed=0, **options) -> HookedTransformer:
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**{**SIZES, **options}), dtype=torch.float64).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    return model


def tokens(seed):
    return torch.randint(0, SIZES["d_vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


METRIC = LogitDiff(3, 11)


def near(got: float, expected: float) -> None:
    assert abs(got - expected) <= ATOL, (got, expected)


def close(a, b, what):
    assert a.shape == b.shape, what
    err = (a - b).abs().max()
    assert err <= ATOL, f"{what}: {err}"


def loop_value(model, corrupted, clean_cache, name, index) -> float:
    """Mean metric of one full forward of the corrupted tokens with act[index] from the clean run."""
    def patch(act, hook):
        act = act.clone()
        act[index] = clean_cache[name][index]
        return act

    with torch.no_grad():
        return float(METRIC(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])).mean())


# -- grouped-query attention: patching ------------------------------------------------------------
def grouped_runs(n_kv: int):
    model = build(n_key_value_heads=n_kv, **ROTARY)
    clean, corrupted = tokens(1), tokens(2)
    _, cache = model.run_with_cache(clean)
    return model, clean, corrupted, cache


@pytest.fixture(scope="module", params=[2, 1], ids=["gqa", "mqa"])
def grouped_any(request):  # grouped-query and multi-query attention
    return grouped_runs(request.param)


@pytest.fixture(scope="module")
def grouped():  # the slower sweeps: grouped-query only
    return grouped_runs(2)


def test_k_sweep_sweeps_kv_heads_and_equals_the_loop(grouped_any):
    model, _, corrupted, cache = grouped_any
    n_kv = model.cfg.n_key_value_heads
    result = patch_head_k(model, corrupted, cache, METRIC)
    assert result.axes == ("layer", "kv_head") and result.shape == (3, n_kv)
    groups = 6 // n_kv
    assert result.labels["kv_head"] == [f"{i} (q {i * groups}-{i * groups + groups - 1})" for i in range(n_kv)]
    for layer in range(3):
        for kv in range(n_kv):
            name = f"blocks.{layer}.attn.hook_k"
            expected = loop_value(model, corrupted, cache, name, (slice(None), slice(None), kv))
            near(float(result.values[layer, kv]), expected)


def test_v_by_pos_sweep_equals_the_loop(grouped):
    model, _, corrupted, cache = grouped
    result = patch_head_v_by_pos(model, corrupted, cache, METRIC)
    n_kv = model.cfg.n_key_value_heads
    assert result.axes == ("layer", "pos", "kv_head") and result.shape == (3, SEQ, n_kv)
    for layer, pos, kv in [(0, 0, 0), (1, 3, n_kv - 1), (2, SEQ - 1, 0), (2, 2, n_kv - 1)]:
        name = f"blocks.{layer}.attn.hook_v"
        expected = loop_value(model, corrupted, cache, name, (slice(None), pos, kv))
        near(float(result.values[layer, pos, kv]), expected)


def test_q_and_z_sweeps_stay_per_query_head(grouped):
    model, _, corrupted, cache = grouped
    for sweep, hook in ((patch_head_q, "hook_q"), (patch_head_z, "hook_z")):
        result = sweep(model, corrupted, cache, METRIC)
        assert result.axes == ("layer", "head") and result.shape == (3, 6)
        for layer, head in [(0, 5), (2, 1)]:
            expected = loop_value(model, corrupted, cache, f"blocks.{layer}.attn.{hook}",
                                  (slice(None), slice(None), head))
            near(float(result.values[layer, head]), expected)


def test_stacked_head_sweeps_and_head_axis_on_keys_are_refused(grouped):
    model, _, corrupted, cache = grouped
    for sweep in (patch_head_every, patch_head_every_by_pos):
        with pytest.raises(ValueError, match="n_key_value_heads=.*ungroup_grouped_query_attention"):
            sweep(model, corrupted, cache, METRIC)
    with pytest.raises(ValueError, match="hook_k has a kv_head axis, not head.*'kv_head'"):
        activation_patch(model, corrupted, cache, METRIC, "k", ("layer", "head"))
    # the generic engine sweeps the kv_head axis of any grouped hook when asked, rotated keys too
    result = activation_patch(model, corrupted, cache, METRIC, "blocks.{L}.attn.hook_rot_k", ("layer", "kv_head"))
    expected = loop_value(model, corrupted, cache, "blocks.1.attn.hook_rot_k", (slice(None), slice(None), 0))
    near(float(result.values[1, 0]), expected)


def test_ungrouped_keys_sweep_per_query_head():
    model = build(n_key_value_heads=2, ungroup_grouped_query_attention=True, **ROTARY)
    corrupted = tokens(2)
    _, cache = model.run_with_cache(tokens(1))
    result = patch_head_k(model, corrupted, cache, METRIC)
    assert result.axes == ("layer", "head") and result.shape == (3, 6)
    expected = loop_value(model, corrupted, cache, "blocks.2.attn.hook_k", (slice(None), slice(None), 4))
    near(float(result.values[2, 4]), expected)
    # stacked with the queries on one head axis, as without grouping
    stacked = activation_patch(model, corrupted, cache, METRIC, ["q", "k"], ("layer", "head"))
    assert stacked.shape == (2, 3, 6) and torch.equal(stacked.values[1], result.values)


def test_path_patching_into_a_kv_head_equals_the_two_forwards(grouped_any):
    model, _, corrupted, cache = grouped_any
    n_kv = model.cfg.n_key_value_heads
    sender, receiver = (0, 4), (2, n_kv - 1, "k")
    got = float(path_patch(model, corrupted, cache, METRIC, [sender], [receiver]))
    with torch.no_grad():
        _, corrupted_cache = model.run_with_cache(corrupted)
        captured = {}

        def run1(act, hook):  # every head frozen at its corrupted z, the sender clean
            layer = int(hook.name.split(".")[1])
            out = corrupted_cache[hook.name].clone()
            if layer == sender[0]:
                out[:, :, sender[1]] = cache[hook.name][:, :, sender[1]]
            return out

        name = f"blocks.{receiver[0]}.attn.hook_k"
        hooks = [(f"blocks.{l}.attn.hook_z", run1) for l in range(3)]
        hooks.append((name, lambda act, hook: captured.__setitem__("k", act.clone())))
        model.run_with_hooks(corrupted, fwd_hooks=hooks)

        def run2(act, hook):
            act = act.clone()
            act[:, :, receiver[1]] = captured["k"][:, :, receiver[1]]
            return act

        expected = float(METRIC(model.run_with_hooks(corrupted, fwd_hooks=[(name, run2)])).mean())
    near(got, expected)
    with pytest.raises(ValueError, match=f"n_key_value_heads={n_kv}: a k or v receiver names a kv head"):
        path_patch(model, corrupted, cache, METRIC, [sender], [(2, n_kv, "v")])


# -- grouped-query attention: circuits --------------------------------------------------------------
def test_svd_of_a_grouped_heads_ov_uses_its_kv_head(grouped_any):
    model = grouped_any[0]
    groups = model.cfg.n_kv_groups
    for layer, head in [(0, 5), (2, 1)]:
        ours = singular_directions(model, "OV", layer, head)  # [d_head d_model]
        block = model.blocks[layer].attn
        ov = (block.W_V[head // groups] @ block.W_O[head]).detach()  # formed here, [d_model d_model]
        reference = torch.linalg.svd(ov)[2][: model.cfg.d_head]
        overlap = (ours @ reference.T).abs()  # orthonormal rows up to sign: |overlap| is the identity
        assert torch.allclose(overlap, torch.eye(model.cfg.d_head, dtype=overlap.dtype), atol=1e-12)  # measured 5.2e-14 (entries up to 1), bound 1e-12: 19x
        assert torch.allclose(model.OV[layer, head].AB, ov, atol=ATOL)  # the repeated model-level view agrees


def test_q_composition_is_refused_with_qk_norm_v_composition_is_not():
    model = build(n_key_value_heads=2, qk_norm="head", **ROTARY)
    with pytest.raises(ValueError, match="qk_norm='head'"):
        all_composition_scores(model, "Q")
    with pytest.raises(ValueError, match="qk_norm='head'"):
        all_composition_scores(model, "K")
    assert all_composition_scores(model, "V").shape == (3, 6, 3, 6)


# -- sandwich and output norms ---------------------------------------------------------------------
GEMMA = dict(ROTARY, act_fn="gelu_new", norm_placement="sandwich", norm_weight_offset=1.0, scale_embed=True,
             n_key_value_heads=3, attn_scores_soft_cap=7.0, attn_types=("local", "global", "local"),
             window_size=3)
OLMO = dict(ROTARY, norm_placement="output", qk_norm="full", n_key_value_heads=2)
LN_SANDWICH = dict(norm_placement="sandwich", n_key_value_heads=2, act_fn="gelu")  # LayerNorm: centred, b


@pytest.fixture(scope="module", params=[GEMMA, OLMO, LN_SANDWICH], ids=["gemma", "olmo2", "ln_sandwich"])
def normed(request):
    model = build(**request.param)
    logits, cache = model.run_with_cache(tokens(5))
    return model, logits, cache


def test_decompositions_sum_to_the_residual_stream(normed):
    model, _, cache = normed
    for layer in range(4):
        stream = cache[f"blocks.{layer}.hook_resid_pre"] if layer < 3 else cache["blocks.2.hook_resid_post"]
        close(cache.decompose_resid(layer).sum(0), stream, f"decompose_resid({layer})")
        full = get_full_resid_decomposition(cache, layer)
        close(full.sum(0), stream, f"full decomposition({layer})")
        lumped = get_full_resid_decomposition(cache, layer, expand_neurons=False)
        close(lumped.sum(0), stream, f"full decomposition({layer}), MLPs whole")
        if layer < 3:
            close(get_full_resid_decomposition(cache, layer, mlp_input=True).sum(0),
                  cache[f"blocks.{layer}.hook_resid_mid"], f"full decomposition({layer}, mlp_input)")


def test_head_and_neuron_rows_sum_to_each_sublayers_output(normed):
    model, _, cache = normed
    heads, labels = cache.stack_head_results(3, incl_b_O=True, return_labels=True)
    per_layer = heads.view(3, 7, *heads.shape[1:])  # 6 heads + b_O per layer
    assert labels[6] == "L0_b_O"
    neurons = stack_neuron_results(cache, 3)
    for layer in range(3):
        close(per_layer[layer].sum(0), cache[f"blocks.{layer}.hook_attn_out"], f"heads of layer {layer}")
        rows = neurons[layer * 13: (layer + 1) * 13].sum(0)
        bias = get_full_resid_decomposition(cache, layer + 1)[-1] - get_full_resid_decomposition(cache, layer,
                                                                                               mlp_input=True)[-1]
        close(rows + bias, cache[f"blocks.{layer}.hook_mlp_out"], f"neurons of layer {layer}")


def test_logit_attribution_and_the_final_norm(normed):
    model, logits, cache = normed
    stack = cache.decompose_resid(None, pos_slice=-1)
    close(cache.apply_ln_to_stack(stack, None, pos_slice=-1, incl_bias=True).sum(0),
          cache["ln_final.hook_out"][:, -1], "apply_ln_to_stack at ln_final")
    lens = cache.accumulated_resid(None, apply_ln=True, pos_slice=-1)
    close(lens[-1], cache["ln_final.hook_out"][:, -1], "logit lens, last entry")
    if model.cfg.output_logits_soft_cap is None:
        attrs = cache.logit_attrs(stack, 3, 11, pos_slice=-1)
        close(attrs.sum(0), logits[:, -1, 3] - logits[:, -1, 11], "logit_attrs")


def test_norm_inside_blocks_sandwich_applies_output_refuses(normed):
    model, _, cache = normed
    stack = cache.decompose_resid(2, mlp_input=True)
    if model.cfg.norm_placement == "output":
        with pytest.raises(ValueError, match="norm_placement='output'.*no norm applies"):
            cache.apply_ln_to_stack(stack, 2, mlp_input=True)
        return
    ln2_out = cache["blocks.2.ln2.hook_out"]
    close(cache.apply_ln_to_stack(stack, 2, mlp_input=True, incl_bias=model.cfg.normalization == "LN").sum(0),
          ln2_out, "apply_ln_to_stack at ln2 (sandwich)")


def test_accumulated_bias_is_refused_where_norms_follow_the_sublayers(normed):
    model = normed[0]
    with pytest.raises(ValueError, match=f"norm_placement='{model.cfg.norm_placement}'"):
        accumulated_bias(model, 2)


def test_soft_capped_logits_refuse_attribution_unless_pre_cap():
    model = build(**GEMMA, output_logits_soft_cap=2.0)
    _, cache = model.run_with_cache(tokens(5))
    stack = cache.decompose_resid(None, pos_slice=-1)
    with pytest.raises(ValueError, match=r"output_logits_soft_cap=2.0.*pre_cap=True"):
        cache.logit_attrs(stack, 3, 11, pos_slice=-1)
    attrs = cache.logit_attrs(stack, 3, 11, pos_slice=-1, pre_cap=True)
    pre = cache["unembed.hook_pre_cap"][:, -1]
    close(attrs.sum(0), pre[:, 3] - pre[:, 11], "logit_attrs of the uncapped logits")


def test_svd_w_in_folds_the_norm_the_mlp_reads():
    for options, norm in ((GEMMA, "ln2"), (dict(LN_SANDWICH), "ln2"),
                          (dict(parallel_attn_mlp=True, parallel_ln2=True), "ln2"),
                          (dict(parallel_attn_mlp=True), "ln1"), (OLMO, None)):
        model = build(**options)
        block = model.blocks[1]
        matrix = block.mlp.W_in.detach().T
        if norm is not None:
            matrix = matrix * (getattr(block, norm).w.detach() + model.cfg.norm_weight_offset)
        reference = torch.linalg.svd(matrix)[2]
        ours = singular_directions(model, "w_in", 1)
        k = min(matrix.shape)
        overlap = (ours[:k] @ reference[:k].T).abs()
        assert torch.allclose(overlap, torch.eye(k, dtype=overlap.dtype), atol=2e-14), options  # measured 2.0e-15 (entries up to 1), bound 2e-14: 10x


def test_parallel_ln2_decomposes_and_has_no_mlp_input_stream():
    model = build(parallel_attn_mlp=True, parallel_ln2=True, **ROTARY, n_key_value_heads=3)
    _, cache = model.run_with_cache(tokens(5))
    for layer in range(4):
        stream = cache[f"blocks.{layer}.hook_resid_pre"] if layer < 3 else cache["blocks.2.hook_resid_post"]
        close(get_full_resid_decomposition(cache, layer).sum(0), stream, f"parallel_ln2 layer {layer}")
    close(cache.apply_ln_to_stack(cache.decompose_resid(1), 1).sum(0), cache["blocks.1.ln1.hook_out"],
          "ln1 of a parallel block")
    with pytest.raises(ValueError, match="parallel blocks have no MLP-input residual stream"):
        cache.decompose_resid(1, mlp_input=True)


def test_normed_projected_decomposition_folds_both_norms_exactly(normed):
    model, _, cache = normed
    direction = torch.randn(18, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    rows = get_full_resid_decomposition(cache, None, apply_ln=True, project_output_onto=direction)
    b = getattr(model.ln_final, "b", None)  # the final norm's bias is in no row
    expected = cache["ln_final.hook_out"] - (0 if b is None else b.detach())
    close(rows.sum(0), expected @ direction, "projected, normed decomposition")
    per_neuron = stack_neuron_results(cache, None, apply_ln=True, project_output_onto=direction)
    unfolded = stack_neuron_results(cache, None, apply_ln=True) @ direction  # normed in d_model, then projected
    close(per_neuron, unfolded, "neuron rows folded vs formed")


def test_prefix_reuse_under_local_layers_and_soft_caps_equals_the_loop():
    # bands=SEQ: each position's variants start there, reusing the corrupted keys and values before it,
    # which a local layer's window (3 < SEQ) must cut at the right place
    from glassbox.interp.patching import patch_attn_out, patch_resid_pre

    model = build(**GEMMA, output_logits_soft_cap=4.0)
    corrupted = tokens(2)
    _, cache = model.run_with_cache(tokens(1))
    for sweep, hook in ((patch_resid_pre, "hook_resid_pre"), (patch_attn_out, "hook_attn_out")):
        result = sweep(model, corrupted, cache, METRIC, bands=SEQ)
        assert result.shape == (3, SEQ)
        for layer in range(3):
            for pos in range(SEQ):
                expected = loop_value(model, corrupted, cache, f"blocks.{layer}.{hook}", (slice(None), pos))
                near(float(result.values[layer, pos]), expected)
