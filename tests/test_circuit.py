"""Exact circuit evaluation (glassbox.interp.attribution.circuit) against a hook-by-hook oracle.

The oracle (circuit_oracle.py), written from the definition and sharing no code with circuit.py,
rebuilds every receiver input from the senders' current and corrupted outputs, one circuit per
forward.

Tiny models of distinct sizes (3 layers, 4 heads of 5, d_model 22, MLP 19, vocab 31, 9 positions)
with a large init, so that corrupting an edge moves the metric far beyond the float bounds.
"""

import pytest
import torch

from circuit_oracle import ARCHS, N_PROMPTS, SEQ, model_for, node_tables, oracle, plain, prompts, random_masks, tiny
from glassbox.interp.attribution import edges
from glassbox.interp.attribution.circuit import evaluate_circuit
from glassbox.interp.patching import LogitDiff, VariantMetric

METRIC = LogitDiff(torch.tensor([3, 17, 5]), torch.tensor([29, 8, 11]))


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_node_names_match_the_hand_written_tables(arch):
    cfg = model_for(arch).cfg
    senders, receivers = node_tables(cfg)
    assert edges.senders(cfg) == [s[0] for s in senders]
    assert edges.receivers(cfg) == [r[0] for r in receivers]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_oracle_rebuilds_the_clean_and_corrupted_runs(arch):
    """The residual identity the oracle uses: all edges in gives the clean run, none the corrupted."""
    model = model_for(arch, torch.float64)
    clean, corrupted = prompts(model)
    full = torch.ones_like(random_masks(model, 1)[0])
    # measured 1.0e-15 (values up to 2.5), bound 1e-14: 10x
    torch.testing.assert_close(oracle(model, clean, corrupted, METRIC, full), plain(model, clean, METRIC),
                               atol=1e-14, rtol=0)
    torch.testing.assert_close(oracle(model, clean, corrupted, METRIC, ~full), plain(model, corrupted, METRIC),
                               atol=1e-14, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_random_circuits_equal_the_hook_by_hook_oracle(arch):
    model = model_for(arch)
    clean, corrupted = prompts(model)
    masks = random_masks(model, 4, seed=len(arch))
    got = evaluate_circuit(model, clean, corrupted, METRIC, masks)
    assert got.shape == (4,)
    expected = torch.stack([oracle(model, clean, corrupted, METRIC, m) for m in masks])
    ends = torch.stack([plain(model, clean, METRIC), plain(model, corrupted, METRIC)])
    assert (expected - ends[0]).abs().min() > 2e-3 and (expected - ends[1]).abs().min() > 2e-3, \
        f"circuits {expected} sit on the clean/corrupted ends {ends}: prove nothing"
    # measured 3.2e-7 (values up to 1), bound 4e-6: 12x
    torch.testing.assert_close(got, expected, atol=4e-6, rtol=0)


def test_random_circuits_equal_the_oracle_in_float64_with_padding():
    model = model_for("gpt2", torch.float64)
    clean, corrupted = prompts(model, seed=3)
    attention_mask = torch.ones(N_PROMPTS, SEQ, dtype=torch.long)
    attention_mask[1, -3:] = 0  # right padding: read each prompt's last real token
    metric = LogitDiff(torch.tensor([3, 17, 5]), torch.tensor([29, 8, 11]), pos=torch.tensor([-1, -4, -1]))
    masks = random_masks(model, 3, seed=7, p=0.3)
    got = evaluate_circuit(model, clean, corrupted, metric, masks, attention_mask=attention_mask)
    expected = torch.stack([oracle(model, clean, corrupted, metric, m, attention_mask) for m in masks])
    # measured 3.3e-16 (values up to 0.7), bound 4e-15: 12x
    torch.testing.assert_close(got, expected, atol=4e-15, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_mask_is_the_clean_run_and_empty_the_corrupted(arch):
    model = model_for(arch)
    clean, corrupted = prompts(model)
    exists = edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg))
    got = evaluate_circuit(model, clean, corrupted, METRIC, torch.stack([exists, ~exists]), reduce=None)
    with torch.no_grad():
        clean_values, corrupted_values = METRIC(model(clean)), METRIC(model(corrupted))
    # Full: nothing is subtracted but exact zeros, so only the batch size differs from the plain run.
    # measured 4.8e-7 (values up to 3), bound 5e-6: 10x
    torch.testing.assert_close(got[0], clean_values, atol=5e-6, rtol=0)
    # Empty: each receiver's input is the clean one minus all differences, rounded in float32.
    # measured 9.5e-7 (values up to 3), bound 1e-5: 10x
    torch.testing.assert_close(got[1], corrupted_values, atol=1e-5, rtol=0)
    # Entries where no edge exists are ignored: an all-True mask is the full circuit.
    all_true = torch.ones_like(exists)
    assert torch.equal(evaluate_circuit(model, clean, corrupted, METRIC, all_true),
                       evaluate_circuit(model, clean, corrupted, METRIC, exists))


def test_batched_circuits_equal_one_at_a_time_and_any_order():
    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    masks = random_masks(model, 7, seed=2)
    together = evaluate_circuit(model, clean, corrupted, METRIC, masks)
    one_by_one = torch.stack([evaluate_circuit(model, clean, corrupted, METRIC, m) for m in masks])
    small_passes = evaluate_circuit(model, clean, corrupted, METRIC, masks, memory_budget=1)  # one per pass
    order = torch.tensor([6, 2, 0, 5, 1, 3, 4])
    shuffled = evaluate_circuit(model, clean, corrupted, METRIC, masks[order])
    # Batch size changes only the matmuls' rounding. measured 4.8e-7 (values up to 0.8), bound 5e-6: 10x
    torch.testing.assert_close(together, one_by_one, atol=5e-6, rtol=0)
    torch.testing.assert_close(together, small_passes, atol=5e-6, rtol=0)
    torch.testing.assert_close(together[order], shuffled, atol=5e-6, rtol=0)


def test_metrics_over_full_logits_and_per_prompt_values():
    model = model_for("gpt2", torch.float64)
    clean, corrupted = prompts(model)
    masks = random_masks(model, 2, seed=4)

    def spread(logits):  # reads two positions: no one-position shortcut
        return logits[:, -1, 3] - logits[:, 2, 7]

    per_prompt = evaluate_circuit(model, clean, corrupted, spread, masks, reduce=None)
    assert per_prompt.shape == (2, N_PROMPTS)
    expected = torch.stack([oracle(model, clean, corrupted, spread, m) for m in masks])
    # measured 3.3e-16 (values up to 1), bound 4e-15: 12x
    torch.testing.assert_close(per_prompt.mean(1), expected, atol=4e-15, rtol=0)
    variant = VariantMetric(lambda logits: spread(logits).max())
    got = evaluate_circuit(model, clean, corrupted, variant, masks)
    assert torch.equal(got, per_prompt.max(1).values)  # the same logits, reduced otherwise
    single = evaluate_circuit(model, clean, corrupted, METRIC, masks[0])
    assert single.shape == ()


def test_a_graph_circuit_equals_its_mask():
    from glassbox.interp.attribution.graph import Graph

    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    senders, receivers = edges.senders(model.cfg), edges.receivers(model.cfg)
    exists = edges.edge_mask_for(senders, receivers)
    scores = torch.randn(exists.shape, generator=torch.Generator().manual_seed(5)).masked_fill(~exists, float("nan"))
    graph = Graph(senders, receivers, scores).top_k(20)
    got = evaluate_circuit(model, clean, corrupted, METRIC, [graph, graph.top_k(5)])
    want = evaluate_circuit(model, clean, corrupted, METRIC, torch.stack([graph.in_circuit,
                                                                          graph.top_k(5).in_circuit]))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="no circuit"):
        evaluate_circuit(model, clean, corrupted, METRIC, Graph(senders, receivers, scores))


def test_flags_are_restored_and_hooks_removed_when_the_metric_raises():
    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    model.set_use_attn_result(True)  # one flag on before: it must stay on; the others back off
    before = model.hook_flags.as_dict()

    def broken(logits):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        evaluate_circuit(model, clean, corrupted, broken, random_masks(model, 2)[0])
    assert model.hook_flags.as_dict() == before
    assert not any(point.has_hooks for point in model.hook_dict.values())
    # ... and after a successful call too.
    evaluate_circuit(model, clean, corrupted, METRIC, random_masks(model, 2)[0])
    assert model.hook_flags.as_dict() == before
    assert not any(point.has_hooks for point in model.hook_dict.values())


def test_bad_input_is_refused_by_name():
    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    mask = random_masks(model, 1)[0]
    with pytest.raises(ValueError, match="norm_placement='post'"):
        evaluate_circuit(tiny("gpt2", norm_placement="post"), clean, corrupted, METRIC, mask)
    with pytest.raises(ValueError, match="parallel_attn_mlp"):
        evaluate_circuit(tiny("gpt2", parallel_attn_mlp=True), clean, corrupted, METRIC, mask)
    with pytest.raises(TypeError, match="bool tensor"):
        evaluate_circuit(model, clean, corrupted, METRIC, mask.float())
    with pytest.raises(ValueError, match=r"shape \(16, 39\)"):
        evaluate_circuit(model, clean, corrupted, METRIC, mask[:, :-1])
    with pytest.raises(ValueError, match="must match"):
        evaluate_circuit(model, clean, corrupted[:, :-1], METRIC, mask)
    with pytest.raises(ValueError, match="reduce"):
        evaluate_circuit(model, clean, corrupted, METRIC, mask, reduce="sum")
    with pytest.raises(ValueError, match="memory_budget"):
        evaluate_circuit(model, clean, corrupted, METRIC, mask, memory_budget=0)
    with pytest.raises(ValueError, match="one value per row"):
        evaluate_circuit(model, clean, corrupted, lambda logits: METRIC(logits).mean(), mask)
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", lambda act, hook: None)]):
        with pytest.raises(ValueError, match="blocks.1.hook_resid_pre"):
            evaluate_circuit(model, clean, corrupted, METRIC, mask)


def test_a_float16_model_matches_the_oracle_in_its_own_dtype():
    """Differences are kept in float32 and each correction is rounded once to the model's dtype."""
    model = model_for("gpt2", torch.float16)
    clean, corrupted = prompts(model)
    exists = edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg))
    masks = torch.cat([torch.stack([exists, ~exists]), random_masks(model, 3, seed=3)])
    got = evaluate_circuit(model, clean, corrupted, METRIC, masks)
    assert got.dtype == torch.float16
    expected = torch.stack([plain(model, clean, METRIC), plain(model, corrupted, METRIC)]
                           + [oracle(model, clean, corrupted, METRIC, m) for m in masks[2:]])
    # measured 1.5e-3 (values up to 0.73, 3 ulps), bound 1.5e-2: 10x
    torch.testing.assert_close(got, expected, atol=1.5e-2, rtol=0)
