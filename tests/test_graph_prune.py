"""Influence and pruning: against the closed form (I - An)^-1 - I, a hand-computed graph, and conservation.
(On a cross-layer graph of 611 nodes these masks, cumulative scores and graph scores were also equal, bit for
bit, to circuit-tracer 0.5's ``prune_graph`` / ``compute_graph_scores`` run on the same adjacency.)"""

import pytest
import torch

from glassbox.interp.graphs import AttributionGraph, attribute
from glassbox.interp.graphs.prune import graph_scores, logit_weights, node_influence, normalized, prune_graph
from tests.graph_models import family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens


def hand_graph() -> AttributionGraph:
    """1 layer, 1 position: features f0, f1, f2, error, token, one logit (p = 1)."""
    A = torch.zeros(6, 6, dtype=torch.float64)
    A[5, :4] = torch.tensor([6.0, -3.0, 0.5, 0.5])  # the logit reads f0, f1 (a negative edge), f2, the error
    A[:3, 4] = torch.tensor([1.0, -2.0, 1.0])  # each feature reads the token
    return AttributionGraph(tokens=torch.tensor([7]), active_features=torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3]]),
                            activation_values=torch.ones(3), logit_tokens=torch.tensor([4]),
                            logit_probabilities=torch.tensor([1.0], dtype=torch.float64), adjacency=A,
                            values=torch.zeros(6, dtype=torch.float64), n_layers=1, exclude_positions=0)


def test_pruning_by_hand():
    g = hand_graph()
    # influence: f0 0.6, f1 0.3, f2 0.05, error 0.05, token 0.95 (all the features' mass), logit 0
    assert torch.allclose(node_influence(g), torch.tensor([0.6, 0.3, 0.05, 0.05, 0.95, 0.0], dtype=torch.float64))
    r = prune_graph(g, 0.8, 0.98)  # node cut: cumulative 0.487, 0.795, 0.949 -> the score 0.3 -> token, f0, f1
    assert r.node_mask.tolist() == [True, True, False, False, True, True]
    assert r.edge_mask.sum() == 4 and r.edge_mask[5, 0] and r.edge_mask[5, 1] and r.edge_mask[0, 4] and r.edge_mask[1, 4]
    assert r.kept_influence == pytest.approx(1.85 / 1.95, abs=1e-12)
    r = prune_graph(g, 0.8, 0.6)  # edge scores 2/3, 2/3, 1/3, 1/3: keep the two 2/3 edges; f1 loses its output
    assert r.node_mask.tolist() == [True, False, False, False, True, True]
    assert r.edge_mask.nonzero().tolist() == [[0, 4], [5, 0]]
    assert r.kept_influence == pytest.approx(1.55 / 1.95, abs=1e-12)
    cumulative = r.cumulative_scores[[4, 0, 1, 5]].tolist()  # token, f0, f1, logit (f2 and the error tie)
    assert cumulative == pytest.approx([0.95 / 1.95, 1.55 / 1.95, 1.85 / 1.95, 1.0], abs=1e-12)
    for bad in (-0.1, 1.5, float("nan"), "0.8", True):  # a str may meet the test suite's type checker first
        with pytest.raises((ValueError, TypeError), match="node_threshold"):
            prune_graph(g, bad)
        with pytest.raises((ValueError, TypeError), match="edge_threshold"):
            prune_graph(g, 0.8, bad)


@pytest.mark.parametrize("kind", [dict(), dict(cross_layer=True, activation="jumprelu")], ids=["plt", "clt"])
def test_influence_closed_form_and_conservation(kind):
    model, _ = family_model("gpt2")
    g = attribute(model, family_transcoders("gpt2", **kind), prompt_tokens("induction", 2, 53), batch_size=64)
    inf = node_influence(g).double()
    An = normalized(g.adjacency.double())
    w = logit_weights(g).double()
    eye = torch.eye(g.n_nodes, dtype=torch.float64)
    closed = w @ (torch.linalg.inv(eye - An) - eye)
    # measured max |power series - closed form| 3.0e-8 (float32 adjacency), influences up to 0.8
    assert (inf - closed).abs().max() < 1e-6
    # conservation: the nodes without inputs receive all the logit weight
    sinks = g.adjacency.abs().sum(1) == 0
    assert sinks[g.error_start:g.logit_start].all()
    assert abs(inf[sinks].sum().item() - w.sum().item()) < 1e-6  # measured 1.2e-7
    # each node's influence is what its targets pass on to it
    passed = (inf + w) @ An
    assert (passed - inf).abs().max() < 1e-6
    r = prune_graph(g)
    assert 0.8 <= r.kept_influence <= 1.0 and r.node_mask[g.token_start:].all()
    assert not r.edge_mask[~r.node_mask].any() and not r.edge_mask[:, ~r.node_mask].any()
    rep, comp = graph_scores(g)
    assert 0 < rep < 1 and 0 < comp < 1
