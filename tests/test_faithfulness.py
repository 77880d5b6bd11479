"""Faithfulness curves (glassbox.interp.attribution.faithfulness): MIB's f, CPR and CMD.

The oracle: the top-k edges chosen here by hand (numpy's stable argsort of |score|), each circuit's
metric from the hook-by-hook oracle of circuit_oracle.py, f = (m(C) - m(empty)) / (m(full) - m(empty))
with m(full) and m(empty) the plain clean and corrupted runs, and the areas by the trapezoidal rule
written out.
"""

import numpy as np
import pytest
import torch

from circuit_oracle import model_for, oracle, plain, prompts
from glassbox.interp.attribution import edges
from glassbox.interp.attribution.faithfulness import (MIB_FRACTIONS, edge_counts, faithfulness, faithfulness_curve,
                                                      trapezoid)
from glassbox.interp.attribution.graph import Graph
from glassbox.interp.patching import LogitDiff
from glassbox.models import Config

METRIC = LogitDiff(torch.tensor([3, 17, 5]), torch.tensor([29, 8, 11]))


def random_graph(model, seed=5):
    senders, receivers = edges.senders(model.cfg), edges.receivers(model.cfg)
    exists = edges.edge_mask_for(senders, receivers)
    scores = torch.randn(exists.shape, generator=torch.Generator().manual_seed(seed))
    return Graph(senders, receivers, scores.masked_fill(~exists, float("nan")))


def top_k_by_hand(graph, k):
    flat = graph.scores.reshape(-1).numpy()
    existing = np.flatnonzero(~np.isnan(flat))
    order = existing[np.argsort(-np.abs(flat[existing]), kind="stable")]
    mask = np.zeros(flat.shape, dtype=bool)
    mask[order[:k]] = True
    return torch.from_numpy(mask.reshape(graph.scores.shape))


def test_the_areas_and_the_ratio_by_hand():
    assert trapezoid([0.0, 0.5, 1.0], [0.0, 1.0, 1.0]) == 0.75  # 0.5 * 0.5 + 0.5 * 1
    assert trapezoid([0.2], [0.7]) == 0.0
    values = torch.tensor([2.0, 5.0, -1.0], dtype=torch.float64)
    assert torch.equal(faithfulness(values, full=5.0, empty=2.0), torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="undefined"):
        faithfulness(values, 3.0, 3.0)


def test_sizes_as_fractions_count_edges_like_mib_and_ints_are_counts():
    cfg = Config(d_model=768, n_layers=12, n_heads=12, d_vocab=50257, n_ctx=1024)  # GPT-2 small's shape
    n_edges = int(edges.edge_mask_for(edges.senders(cfg), edges.receivers(cfg)).sum())
    assert n_edges == 32491  # MIB's published edge count of GPT-2 small (its EDGE_COUNTS["gpt2"])
    counts, fractions = edge_counts(MIB_FRACTIONS, n_edges)
    assert counts == [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]
    assert fractions == list(MIB_FRACTIONS)
    assert edge_counts([0, 3, 10], 40) == ([0, 3, 10], [0.0, 0.075, 0.25])
    for bad, match in [([0.1, 2], "mixes"), ([0.5, 0.2], "increase"), ([1.5], r"\[0, 1\]"), ([41], "n_edges=40"),
                       ([], "empty"), ([True], "fractions")]:
        with pytest.raises(ValueError, match=match):
            edge_counts(bad, 40)


def test_the_curve_equals_the_oracle_at_every_size():
    model = model_for("gpt2", torch.float64)
    clean, corrupted = prompts(model)
    graph = random_graph(model)
    n = graph.n_edges
    sizes = [0, 4, 17, 90, n]
    curve = faithfulness_curve(model, graph, clean, corrupted, METRIC, sizes=sizes)
    full, empty = plain(model, clean, METRIC).item(), plain(model, corrupted, METRIC).item()
    values = [oracle(model, clean, corrupted, METRIC, top_k_by_hand(graph, k)).item() for k in sizes]
    f = [(v - empty) / (full - empty) for v in values]
    x = [k / n for k in sizes]
    cpr = sum((x[i + 1] - x[i]) * (f[i] + f[i + 1]) / 2 for i in range(len(x) - 1))
    cmd = sum((x[i + 1] - x[i]) * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2 for i in range(len(x) - 1))
    assert curve.sizes == sizes and curve.n_edges == n == 262
    assert curve.fractions == x
    assert min(abs(v - e) for v in values[2:4] for e in (full, empty)) > 0.05, "middle circuits sit on an end"
    # measured 4.4e-16 (values up to 0.6), bound 1e-14: 22x
    torch.testing.assert_close(curve.values, torch.tensor(values, dtype=torch.float64), atol=1e-14, rtol=0)
    torch.testing.assert_close(torch.tensor([curve.full, curve.empty], dtype=torch.float64),
                               torch.tensor([full, empty], dtype=torch.float64), atol=1e-14, rtol=0)
    # f divides by m(full) - m(empty) = -0.65. measured 1.3e-15, bound 3e-14: 22x; areas 8.9e-16, same bound
    torch.testing.assert_close(curve.faithfulness, torch.tensor(f, dtype=torch.float64), atol=3e-14, rtol=0)
    assert curve.cpr == pytest.approx(cpr, abs=3e-14) and curve.cmd == pytest.approx(cmd, abs=3e-14)
    assert curve.faithfulness[0] == pytest.approx(0.0, abs=3e-14)  # the empty circuit
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=3e-14)  # every edge
    assert curve.smallest_size(float(curve.faithfulness[2])) <= 17
    assert curve.as_dict()["cpr"] == curve.cpr


def test_mib_fractions_and_signed_ranking():
    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    graph = random_graph(model, seed=9)
    curve = faithfulness_curve(model, graph, clean, corrupted, METRIC)
    assert curve.sizes == [int(p * 262) for p in MIB_FRACTIONS] == [0, 0, 1, 2, 5, 13, 26, 52, 131, 262]
    assert curve.fractions == list(MIB_FRACTIONS)
    signed = faithfulness_curve(model, graph, clean, corrupted, METRIC, sizes=[5, 20], absolute=False)
    flat = graph.scores.reshape(-1).numpy()
    existing = np.flatnonzero(~np.isnan(flat))
    order = existing[np.argsort(-flat[existing], kind="stable")]
    for k, value in zip([5, 20], signed.values.tolist()):
        mask = np.zeros(flat.shape, dtype=bool)
        mask[order[:k]] = True
        expected = oracle(model, clean, corrupted, METRIC, torch.from_numpy(mask.reshape(graph.scores.shape)))
        # measured 1.8e-7 (values up to 1), bound 4e-6: 22x
        assert value == pytest.approx(expected.item(), abs=4e-6)


def test_a_corruption_that_changes_nothing_is_refused():
    model = model_for("gpt2")
    clean, _ = prompts(model)
    with pytest.raises(ValueError, match="undefined"):
        faithfulness_curve(model, random_graph(model), clean, clean, METRIC, sizes=[0, 5])


def test_a_graph_of_another_model_is_refused():
    model = model_for("gpt2")
    clean, corrupted = prompts(model)
    other = random_graph(model_for("attn-only"))
    with pytest.raises(ValueError, match="senders"):
        faithfulness_curve(model, other, clean, corrupted, METRIC, sizes=[0, 5])
