"""The patching engine on tiny models: every architecture, padding, chunking, options, failures, errors.

Each sweep is compared with the one-patch-per-forward oracle (patching_oracle.py): resid_pre sweeps at
every grid point, larger grids at their corners and a seeded sample. Tiny
configs use distinct sizes (3 layers, 5 heads of 6, d_model 21, MLP 17, vocab 31, 11 positions) and a
large init so that patches move the metric far more than the tolerance.
"""


import pytest
import torch

from glassbox.interp import patching
from glassbox.interp.patching import (LogitDiff, TargetLoss, activation_patch, patch_head_k_by_pos,
                                      patch_head_pattern_by_pos, patch_resid_pre, path_patch_heads)
from glassbox.interp.patching.engine import Sweep
from patching_oracle import SIZES, loop_value, sample_points, tiny_model as tiny

N_PROMPTS, SEQ = 2, 11


def make_runs(model, mask=None):
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g).to(model.cfg_device())
    corrupted = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g).to(model.cfg_device())
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, attention_mask=mask)
    return clean, corrupted, cache


METRIC = LogitDiff(torch.tensor([3, 17]), torch.tensor([29, 8]))


def assert_equals_loop(model, corrupted, cache, result, kind, metric=METRIC, mask=None, atol=1e-5, n=12):
    """Compare at the corners and ``n`` seeded random points of the grid (each costs a full forward)."""
    values = result.values.cpu()
    assert (values.max() - values.min()) > 1000 * atol, f"{result} is nearly constant: proves nothing"
    for point in sample_points(result.shape, n, seed=len(kind)):
        named = dict(zip(result.axes, point))
        expected = loop_value(model, corrupted, cache, metric, kind, named, attention_mask=mask)
        # measured 7.2e-16 (values up to 0.13), bound 1e-12: 1386x; measured 6.6e-7 (values up to 1.9), bound 1e-5: 15x
        torch.testing.assert_close(values[point], torch.tensor(expected, dtype=values.dtype), atol=atol, rtol=0,
                                   msg=f"{kind} at {named}: batched {values[point].item()}, loop {expected}")


@pytest.mark.parametrize("preset, changes", [("gpt2", {}), ("modern", {}), ("classic", {}),
                                             ("gpt2", {"parallel_attn_mlp": True})],
                         ids=["gpt2", "modern-rotary", "classic-postnorm", "parallel"])
def test_every_architecture_equals_loop(preset, changes):
    model = tiny(preset, **changes)
    _, corrupted, cache = make_runs(model)
    assert_equals_loop(model, corrupted, cache, patch_resid_pre(model, corrupted, cache, METRIC), "resid_pre", n=99)
    # Keys by position, in 3 bands: prefix reuse hands over cached (rotated, for rotary) keys/values.
    assert_equals_loop(model, corrupted, cache, patch_head_k_by_pos(model, corrupted, cache, METRIC, bands=3), "k")
    assert_equals_loop(model, corrupted, cache,
                       patch_head_pattern_by_pos(model, corrupted, cache, METRIC, bands=4, memory_budget=60_000),
                       "pattern")


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_prompts_equal_loop(side):
    model = tiny()
    mask = torch.ones(N_PROMPTS, SEQ, dtype=torch.bool)
    if side == "right":
        mask[1, 7:] = False
        metric = LogitDiff(torch.tensor([3, 17]), torch.tensor([29, 8]), pos=torch.tensor([SEQ - 1, 6]))
    else:
        mask[1, :4] = False
        metric = METRIC
    _, corrupted, cache = make_runs(model, mask)
    result = patch_resid_pre(model, corrupted, cache, metric, attention_mask=mask)
    assert_equals_loop(model, corrupted, cache, result, "resid_pre", metric=metric, mask=mask)
    by_pos = activation_patch(model, corrupted, cache, metric, "v", ("layer", "pos", "head"), attention_mask=mask,
                              bands=3)
    assert_equals_loop(model, corrupted, cache, by_pos, "v", metric=metric, mask=mask)


def test_clean_into_clean_gives_the_clean_metric_for_every_named_sweep():
    model = tiny()
    clean, _, cache = make_runs(model)
    with torch.no_grad():
        clean_value = METRIC(model(clean)).mean()
    names = [name for name in patching.__all__ if name.startswith("patch_")]
    assert len(names) == 18
    for name in names:
        result = getattr(patching, name)(model, clean, cache, METRIC)
        # measured 4.5e-7 (values up to 0.043), bound 1e-5: 22x
        torch.testing.assert_close(result.values, clean_value.expand(result.shape), atol=1e-5, rtol=0, msg=name)
    paths = path_patch_heads(model, clean, cache, METRIC, [(2, 1, "q")])
    # measured 5.1e-7 (values up to 0.043), bound 1e-5: 20x
    torch.testing.assert_close(paths.values[:2], clean_value.expand(2, 5), atol=1e-5, rtol=0)


def test_float64_equals_loop_to_rounding():
    model = tiny(dtype=torch.float64)
    _, corrupted, cache = make_runs(model)
    result = activation_patch(model, corrupted, cache, METRIC, "z", ("layer", "pos", "head"))
    assert result.values.dtype == torch.float64
    assert_equals_loop(model, corrupted, cache, result, "z", atol=1e-12)


def test_options_and_chunking_give_identical_results():
    model = tiny()
    _, corrupted, cache = make_runs(model)
    reference = patch_resid_pre(model, corrupted, cache, METRIC)
    assert not reference.values.requires_grad and torch.is_grad_enabled()
    sweep = Sweep(model, corrupted, None, METRIC, "mean", 50_000, False, True, 4)
    variants = [(layer, pos) for layer in range(3) for pos in range(SEQ)]
    plan = sweep.passes(variants, [pos for _, pos in variants], False)
    assert len(plan) > 4  # the budget splits bands into several passes
    assert sorted(i for _, members in plan for i in members) == list(range(len(variants)))
    for first, members in plan:
        assert all(variants[i][1] >= first for i in members)  # prefix reuse only where it is exact
        assert [variants[i][0] for i in members] == sorted(variants[i][0] for i in members)
        assert len(members) == 1 or len(members) * N_PROMPTS * sweep.row_bytes(SEQ - first, False) <= 50_000
    for options in (dict(memory_budget=50_000), dict(reuse_prefix=False), dict(bands=3), dict(bands=SEQ),
                    dict(bands=SEQ, memory_budget=50_000)):
        # measured 7.2e-7 (values up to 1.5); bound 1e-5, 14x
        torch.testing.assert_close(patch_resid_pre(model, corrupted, cache, METRIC, **options).values,
                                   reference.values, atol=1e-5, rtol=0, msg=str(options))
    # A plain callable gets full logits; a PositionMetric only its read position: same numbers.
    full = patch_resid_pre(model, corrupted, cache, lambda logits: METRIC(logits))
    # measured 0 (values up to 1.5), bound 1e-6 (exact here)
    torch.testing.assert_close(full.values, reference.values, atol=1e-6, rtol=0)
    per_prompt = patch_resid_pre(model, corrupted, cache, METRIC, reduce=None)
    assert per_prompt.axes == ("layer", "pos", "batch") and per_prompt.shape == (3, SEQ, N_PROMPTS)
    # measured 0 (values up to 1.5), bound 1e-6 (exact here)
    torch.testing.assert_close(per_prompt.values.mean(-1), reference.values, atol=1e-6, rtol=0)
    assert reference.labels == {"layer": ["0", "1", "2"], "pos": [str(i) for i in range(SEQ)]}  # no tokenizer


def test_dict_cache_and_inference_mode_cache_are_accepted():
    model = tiny()
    clean, corrupted, cache = make_runs(model)
    reference = patch_resid_pre(model, corrupted, cache, METRIC)
    names = [f"blocks.{L}.hook_resid_pre" for L in range(3)]
    with torch.inference_mode():
        _, inference_cache = model.run_with_cache(clean, names_filter=names)
        inside = patch_resid_pre(model, corrupted, inference_cache, METRIC).values
    plain = patch_resid_pre(model, corrupted, {n: cache[n] for n in names}, METRIC).values
    torch.testing.assert_close(inside, reference.values, atol=5e-6, rtol=0)  # measured 4.8e-7; 10x
    torch.testing.assert_close(plain, reference.values, atol=0, rtol=0)


def test_progress_bar_silent_unless_asked(capfd):
    model = tiny()
    _, corrupted, cache = make_runs(model)
    patch_resid_pre(model, corrupted, cache, METRIC)
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""
    patch_resid_pre(model, corrupted, cache, METRIC, progress=True)
    assert "patching resid_pre" in capfd.readouterr().err


@pytest.mark.parametrize("call, error, message", [
    (lambda m, t, c: activation_patch(m, t, c, METRIC, "resid", ("layer",)), ValueError, "unknown activation 'resid'"),
    (lambda m, t, c: activation_patch(m, t, c, METRIC, "blocks.{L}.hook_nope", ("layer",)), KeyError, "hook_nope"),
    (lambda m, t, c: activation_patch(m, t, c, METRIC, "resid_pre", ("layer", "head")), ValueError, "axis 'head'"),
    (lambda m, t, c: activation_patch(m, t, c, METRIC, "z", ("pos", "layer")), ValueError, "start with 'layer'"),
    (lambda m, t, c: patch_resid_pre(m, t, {}, METRIC), KeyError, "blocks.0.hook_resid_pre"),
    (lambda m, t, c: patch_resid_pre(m, t[:, :5], c, METRIC), ValueError, r"\(2, 11, 21\).*\(2, 5, 21\)"),
    (lambda m, t, c: patch_resid_pre(m, t, c, lambda logits: METRIC(logits).mean()), ValueError, "one value per row"),
    (lambda m, t, c: patch_resid_pre(m, t, c, METRIC, reduce="sum"), ValueError, "reduce"),
    (lambda m, t, c: patch_resid_pre(m, t, c, METRIC, memory_budget=0), ValueError, "memory_budget"),
    (lambda m, t, c: patch_resid_pre(m, t + 100, c, METRIC), ValueError, "token id"),
    (lambda m, t, c: patch_resid_pre(m, t, c, LogitDiff(0, 1, pos=SEQ)), ValueError, "outside a sequence"),
    (lambda m, t, c: patch_resid_pre(m, t, c, "logit diff"), TypeError, "metric"),  # typeguard's or ours
])
def test_bad_input_is_named(call, error, message):
    model = tiny()
    _, corrupted, cache = make_runs(model)
    with pytest.raises(error, match=message):
        call(model, corrupted, cache)
    assert not model.has_hooks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    cpu = tiny()
    gpu = tiny(device="cuda")
    results = []
    for model in (cpu, gpu):
        _, corrupted, cache = make_runs(model)
        result = activation_patch(model, corrupted, cache, TargetLoss(torch.tensor([3, 5])), "z", ("layer", "pos", "head"))
        assert result.values.device.type == model.cfg_device().type
        results.append(result.values.cpu())
    torch.testing.assert_close(results[1], results[0], atol=1e-4, rtol=0)  # CUDA vs CPU: not yet measured on a GPU
