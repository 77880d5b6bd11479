"""Every batched patching sweep equals a plain one-patch-per-forward loop, on the GPT-2-small shape.

The oracle is written here: for one grid point, a full forward of the corrupted tokens with one hook
that overwrites the indexed slice of the activation by the clean run's value, then the metric, then
its mean over prompts. No start-from-cache, no batching, no prefix reuse, no partial unembedding.
Grids on this shape are large, so each sweep is compared at a seeded sample of its grid points that
always includes the corners (first and last layer, position and head); the layer x position sweeps
are compared in full for resid_pre.

One module-scoped random GPT-2-small (124M parameters) serves every test here; the prompt is 1 x 4
tokens so the whole module stays near a minute on two cores. Several prompts per batch (rows tiled
variant-major) are proven on tiny models in test_patching_engine.py.
"""

import itertools

import pytest
import torch

from glassbox.interp.patching import (LogitDiff, Normalized, activation_patch, patch_block_every,
                                      patch_head_every, patch_head_every_by_pos, patch_head_pattern_by_pos,
                                      patch_resid_mid, patch_resid_post, patch_resid_pre)
from glassbox.models import Config, HookedTransformer
from patching_oracle import loop_value, sample_points

ATOL = 1e-5
N_PROMPTS, SEQ = 1, 4
@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = Config(d_model=768, n_layers=12, n_heads=12, d_vocab=50257, n_ctx=1024)
    return HookedTransformer(cfg).eval()


@pytest.fixture(scope="module")
def runs(gpt2):
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, 50257, (N_PROMPTS, SEQ), generator=g)
    corrupted = torch.randint(0, 50257, (N_PROMPTS, SEQ), generator=g)
    names = lambda name: any(name.endswith(s) for s in ("resid_pre", "resid_mid", "resid_post", "attn_out",
                                                         "mlp_out", "hook_z", "hook_q", "hook_k", "hook_v",
                                                         "hook_pattern"))
    with torch.no_grad():
        clean_logits, cache = gpt2.run_with_cache(clean, names_filter=names)
        corrupted_logits = gpt2(corrupted)
    metric = LogitDiff(torch.tensor([4000]), torch.tensor([977]))
    return dict(clean=clean, corrupted=corrupted, cache=cache, metric=metric, clean_logits=clean_logits,
                corrupted_logits=corrupted_logits)


def assert_matches_loop(model, runs, result, kinds, n: int, seed: int, axes=None):
    axes = axes or result.axes
    values = result.values.cpu()
    spread = (values.max() - values.min()).item()
    # Distinct variants must give clearly distinct values, or a misplaced patch could pass.
    assert spread > 1000 * ATOL, f"{result} is nearly constant (spread {spread}); the test would prove nothing"
    for point in sample_points(result.shape, n, seed):
        named = dict(zip(axes, point))
        kind = kinds[named.pop("component")] if "component" in named else kinds[0]
        expected = loop_value(model, runs["corrupted"], runs["cache"], runs["metric"], kind, named)
        # measured 7.6e-7 (values up to 1.4), bound 1e-5: 13x
        torch.testing.assert_close(values[point], torch.tensor(expected, dtype=values.dtype), atol=ATOL, rtol=0,
                                   msg=f"{result.name} at {dict(zip(axes, point))}: batched "
                                       f"{values[point].item():.7f}, loop {expected:.7f}")


def test_resid_pre_equals_loop_everywhere(gpt2, runs):
    result = patch_resid_pre(gpt2, runs["corrupted"], runs["cache"], runs["metric"])
    assert result.axes == ("layer", "pos") and result.shape == (12, SEQ)
    assert result.labels["pos"] == gpt2.to_str_tokens(runs["corrupted"][0])
    for layer, pos in itertools.product(range(12), range(SEQ)):
        expected = loop_value(gpt2, runs["corrupted"], runs["cache"], runs["metric"], "resid_pre",
                              {"layer": layer, "pos": pos})
        # measured 0 (values up to 1.4), bound 1e-5 (exact here)
        torch.testing.assert_close(result.values[layer, pos].cpu(), torch.tensor(expected, dtype=result.values.dtype),
                                   atol=ATOL, rtol=0, msg=f"resid_pre at layer {layer} pos {pos}")


def test_block_every_and_resid_mid_post_equal_loop(gpt2, runs):
    every = patch_block_every(gpt2, runs["corrupted"], runs["cache"], runs["metric"])
    assert every.axes == ("component", "layer", "pos")
    assert every.labels["component"] == ["resid_pre", "attn_out", "mlp_out"]
    assert_matches_loop(gpt2, runs, every, ["resid_pre", "attn_out", "mlp_out"], 8, seed=1)
    for sweep, kind in ((patch_resid_mid, "resid_mid"), (patch_resid_post, "resid_post")):
        assert_matches_loop(gpt2, runs, sweep(gpt2, runs["corrupted"], runs["cache"], runs["metric"]), [kind], 4,
                            seed=2)


def test_head_sweeps_all_positions_equal_loop(gpt2, runs):
    every = patch_head_every(gpt2, runs["corrupted"], runs["cache"], runs["metric"])
    kinds = ["z", "q", "k", "v", "pattern"]
    assert every.axes == ("component", "layer", "head") and every.shape == (5, 12, 12)
    assert_matches_loop(gpt2, runs, every, kinds, 10, seed=3)


def test_head_sweeps_by_position_equal_loop(gpt2, runs):
    every = patch_head_every_by_pos(gpt2, runs["corrupted"], runs["cache"], runs["metric"])
    assert every.axes == ("component", "layer", "pos", "head") and every.shape == (4, 12, SEQ, 12)
    assert_matches_loop(gpt2, runs, every, ["z", "q", "k", "v"], 12, seed=4)
    pattern = patch_head_pattern_by_pos(gpt2, runs["corrupted"], runs["cache"], runs["metric"])
    assert pattern.axes == ("layer", "head", "query_pos") and pattern.shape == (12, 12, SEQ)
    assert_matches_loop(gpt2, runs, pattern, ["pattern"], 6, seed=5)


def test_clean_into_clean_gives_the_clean_metric_everywhere(gpt2, runs):
    """On this shape for the layer x position sweeps; every named sweep is checked on tiny models."""
    clean_value = runs["metric"](runs["clean_logits"]).mean()
    result = patch_block_every(gpt2, runs["clean"], runs["cache"], runs["metric"])
    # measured 8.3e-7 (values up to 1.3), bound 1e-5: 12x
    torch.testing.assert_close(result.values, clean_value.expand(result.shape), atol=ATOL, rtol=0)


def test_resid_pre_of_every_position_at_layer_0_reproduces_clean_logits(gpt2, runs):
    seen = []

    def full_logits_metric(logits):  # a plain callable: the engine must give it every position
        seen.append(logits)
        return logits[:, -1, 11]

    # axes ("layer",): each variant patches the whole activation (every position) at one layer.
    result = activation_patch(gpt2, runs["corrupted"], runs["cache"], full_logits_metric, "resid_pre", ("layer",))
    assert result.shape == (12,)
    rows = torch.cat(seen)  # variant-major rows: variant 0 is layer 0
    # measured 1.9e-6 (logits up to 2.6); bound 2e-5, 10x
    torch.testing.assert_close(rows[:N_PROMPTS], runs["clean_logits"], atol=2e-5, rtol=0)
    assert (runs["clean_logits"] - runs["corrupted_logits"]).abs().max() > 1.0


def test_normalised_metric_is_one_on_clean_and_zero_on_corrupted(gpt2, runs):
    norm = Normalized.from_logits(runs["metric"], runs["clean_logits"], runs["corrupted_logits"])
    # measured 0 (values up to 1), bound 1e-6 (exact here)
    torch.testing.assert_close(norm(runs["clean_logits"]).mean(), torch.tensor(1.0), atol=1e-6, rtol=0)
    # measured 0 (values up to 0), bound 1e-6 (exact here)
    torch.testing.assert_close(norm(runs["corrupted_logits"]).mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    result = activation_patch(gpt2, runs["corrupted"], runs["cache"], norm, "resid_pre", ("layer",))
    # measured 4.8e-7 (values up to 1), bound 1e-5: 21x
    torch.testing.assert_close(result.values[0], torch.tensor(1.0), atol=1e-5, rtol=0)


def test_all_heads_z_equals_attn_out_patch(gpt2, runs):
    """attn_out = sum_h z_h W_O[h] + b_O. b_O is shared by both runs and is the only part of attn_out
    that z does not carry, so patching every head's z (all positions) gives the clean attn_out, and
    the two sweeps agree to float rounding."""
    z = activation_patch(gpt2, runs["corrupted"], runs["cache"], runs["metric"], "z", ("layer",))
    attn_out = activation_patch(gpt2, runs["corrupted"], runs["cache"], runs["metric"], "attn_out", ("layer",))
    # measured 0 (values up to 1.3), bound 1e-5 (exact here)
    torch.testing.assert_close(z.values, attn_out.values, atol=ATOL, rtol=0)
    assert (attn_out.values.max() - attn_out.values.min()) > 1000 * ATOL
