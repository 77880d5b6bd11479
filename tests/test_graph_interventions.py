"""Interventions: in the frozen replacement a feature ablation's logit change equals the graph's prediction
(direct with the other features held; total with them recomputed, while none crosses its threshold)."""

import pytest
import torch

from glassbox.interp.graphs import ReplacementRun, attribute
from glassbox.interp.graphs.interventions import intervene
from tests.graph_models import family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens


@pytest.fixture(scope="module")
def setup():
    model, _ = family_model("gpt2", dtype=torch.float64)
    ts = family_transcoders("gpt2", dtype=torch.float64, cross_layer=True, activation="jumprelu")
    tokens = prompt_tokens("induction", 4, 53)
    return attribute(model, ts, tokens, batch_size=64), ReplacementRun.capture(model, ts, tokens)


def test_ablation_and_steering_match_the_graph(setup):
    graph, run = setup
    scale = graph.adjacency[graph.logit_start:].abs().max().item()
    matched = 0
    # features of layer 0 and 1 (their effects pass through later features), the most influential first
    early = (graph.active_features[:, 0] < 2).nonzero()[:, 0]
    order = early[graph.adjacency[graph.logit_start:, early].abs().sum(0).argsort(descending=True)][:12]
    for i in order.tolist():
        key = tuple(graph.active_features[i].tolist())
        a = float(graph.activation_values[i])
        for value in (0.0, 0.99 * a, 1.01 * a):  # an ablation, and two small steers that rarely cross a threshold
            r = intervene(graph, run, {key: value})
            # float64, relative to the largest logit edge: measured |frozen_direct - direct| <= 3.3e-16 and
            # |frozen - total| <= 1.6e-15 (14 of the 36 interventions cross no threshold)
            assert (r["frozen_direct"] - r["direct"]).abs().max() <= 1e-13 * scale
            if r["crossed"] == 0:
                assert (r["frozen"] - r["total"]).abs().max() <= 1e-13 * scale, (key, value)
                matched += 1
        assert torch.isfinite(r["live"]).all()
    assert matched >= 12  # the exact comparison ran (of 36), not only the skipped branch
    # the total differs from the direct prediction: the paths through later features count
    assert max((intervene(graph, run, {tuple(graph.active_features[i].tolist()): 0.0})["total"] -
                intervene(graph, run, {tuple(graph.active_features[i].tolist()): 0.0})["direct"]).abs().max()
               for i in order[:3].tolist()) > 1e-3 * scale


def test_bad_interventions_are_refused(setup):
    graph, run = setup
    l, p, f = graph.active_features[0].tolist()
    with pytest.raises(KeyError, match="not an active feature node"):
        intervene(graph, run, {(l, 0, f): 0.0})  # the excluded position has no nodes
    for bad in ({}, {(l, p): 0.0}, {(l, p, f): float("nan")}, {(l, p, f): "0"}):
        with pytest.raises((ValueError, TypeError)):
            intervene(graph, run, bad)
