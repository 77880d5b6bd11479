"""Greedy pruning (glassbox.interp.attribution.prune) against ACDC's rule applied one edge at a time.

The oracle: the receivers from the logits backwards; at each, the in-circuit edges into it ordered by
their single-removal effect (stable), then one circuit per forward (circuit_oracle.py's hook-by-hook
oracle), an edge removed when |m(C without e) - m(C)| < threshold for the circuit C of that moment.
In float64, with the threshold checked to sit far from every measured change, so rounding cannot
flip a decision. A 2-layer tiny model (46 edges) keeps the oracle's hundred-odd forwards fast.
"""

import pytest
import torch

from circuit_oracle import oracle, plain, prompts, tiny
from glassbox.interp.attribution import edges
from glassbox.interp.attribution.circuit import evaluate_circuit
from glassbox.interp.attribution.prune import prune_circuit
from glassbox.interp.patching import LogitDiff, VariantMetric

METRIC = LogitDiff(torch.tensor([3, 17, 5]), torch.tensor([29, 8, 11]))


def small(dtype=torch.float64):
    return tiny("gpt2", dtype, n_layers=2, n_heads=2)


def acdc_one_at_a_time(model, clean, corrupted, metric, threshold, circuit):
    """(circuit, metric, the smallest distance of a measured change from the threshold)."""
    value = oracle(model, clean, corrupted, metric, circuit).item()
    margin = float("inf")
    for r in reversed(range(circuit.shape[1])):
        candidates = circuit[:, r].nonzero().reshape(-1).tolist()
        effect = {}
        for s in candidates:
            trial = circuit.clone()
            trial[s, r] = False
            effect[s] = oracle(model, clean, corrupted, metric, trial).item() - value
        for s in sorted(candidates, key=lambda s: abs(effect[s])):
            trial = circuit.clone()
            trial[s, r] = False
            v = oracle(model, clean, corrupted, metric, trial).item()
            margin = min(margin, abs(abs(v - value) - threshold))
            if abs(v - value) < threshold:
                circuit, value = trial, v
    return circuit, value, margin


def test_pruning_equals_acdc_one_edge_at_a_time():
    model = small()
    clean, corrupted = prompts(model)
    exists = edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg))
    assert int(exists.sum()) == 46
    gap = abs(plain(model, clean, METRIC) - plain(model, corrupted, METRIC)).item()
    threshold = 0.02 * gap
    expected, expected_value, margin = acdc_one_at_a_time(model, clean, corrupted, METRIC, threshold, exists)
    assert margin > 1e-9, margin  # no decision within rounding of the threshold
    graph = prune_circuit(model, clean, corrupted, METRIC, threshold)
    kept = int(graph.in_circuit.sum())
    assert 3 <= kept <= 40, kept  # the rule removes some edges and keeps others
    assert torch.equal(graph.in_circuit, expected)
    # measured 4.4e-16 (values up to 1), bound 1e-14: 22x
    assert graph.metadata["metric_pruned"] == pytest.approx(expected_value, abs=1e-14)
    assert graph.metadata["n_edges_start"] == 46 and graph.metadata["n_edges_pruned"] == kept
    check = evaluate_circuit(model, clean, corrupted, METRIC, graph.in_circuit).item()
    assert check == pytest.approx(expected_value, abs=1e-14)
    # Every edge was considered: each has the change measured when it was decided.
    assert not torch.isnan(graph.scores[exists]).any()
    assert (graph.scores[graph.in_circuit].abs() >= threshold).all()


def test_pruning_from_a_given_circuit_and_the_extreme_thresholds():
    model = small(torch.float32)
    clean, corrupted = prompts(model)
    exists = edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg))
    start = exists.clone()
    start[0] = False  # no edges from the input
    nothing = prune_circuit(model, clean, corrupted, METRIC, 0.0, start=start)
    assert torch.equal(nothing.in_circuit, start)  # no change is < 0
    assert torch.isnan(nothing.scores[0][exists[0]]).all()  # edges outside the start are not considered
    everything = prune_circuit(model, clean, corrupted, METRIC, float("inf"))
    assert not everything.in_circuit.any()
    # measured 4.8e-7 (values up to 1), bound 5e-6: 10x
    assert everything.metadata["metric_pruned"] == pytest.approx(plain(model, corrupted, METRIC).item(), abs=5e-6)


def test_bad_arguments_are_refused():
    model = small(torch.float32)
    clean, corrupted = prompts(model)
    with pytest.raises(ValueError, match="threshold"):
        prune_circuit(model, clean, corrupted, METRIC, -1.0)
    with pytest.raises(ValueError, match="threshold"):
        prune_circuit(model, clean, corrupted, METRIC, float("nan"))
    with pytest.raises(TypeError, match="VariantMetric"):
        prune_circuit(model, clean, corrupted, VariantMetric(lambda logits: logits.sum()), 0.1)
    with pytest.raises(ValueError, match="one circuit"):
        exists = edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg))
        prune_circuit(model, clean, corrupted, METRIC, 0.1, start=torch.stack([exists, exists]))
