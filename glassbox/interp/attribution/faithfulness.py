"""Faithfulness of circuits as MIB defines it (Mueller et al., ICML 2025), evaluated exactly.

The faithfulness of a circuit C is

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

where m is the metric's mean over prompts of the clean run with every edge outside C carrying its
corrupted value (``circuit.evaluate_circuit``); m(full) is the clean run's metric, m(empty) the
corrupted run's. 1 means the circuit recovers the whole model's behaviour, 0 none of it.

``faithfulness_curve`` sweeps circuit sizes: for each size, the graph's top-k edges by |score| (MIB's
``apply_topn``), all sizes evaluated in one batched call, and integrates two areas over them:
- CPR (circuit performance ratio): the area under f, higher is better;
- CMD (circuit-model difference): the area under |1 - f|, lower is better.
The x axis is the fraction of the graph's edges in the circuit, on a linear scale in [0, 1]; the
integral is the trapezoidal rule over the sizes evaluated, in increasing order, and nothing outside
them (MIB's default sizes 0.1%, 0.2%, 0.5%, 1%, 2%, 5%, 10%, 20%, 50%, 100% span [0.001, 1], so
CPR of a perfect circuit at every size is 0.999, not 1).

Sizes: floats are fractions of the edges (k = floor(fraction * n_edges), as MIB counts), ints are
edge counts (x = k / n_edges). Footgun: ``1`` is one edge, ``1.0`` every edge; a list mixing the two
is refused.

MIB prunes, after top-k, edges that no longer connect the input to the logits; that changes the edge
count it reports but not the metric (an edge from a node whose inputs are all corrupted carries its
corrupted value anyway, and a node none of whose outputs are in the circuit reaches nothing), so the
sizes here count every chosen edge.
"""

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from . import edges
from .circuit import DEFAULT_MEMORY_BUDGET, evaluate_circuit

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def faithfulness(values: Tensor, full, empty, resolution: float = 0.0) -> Tensor:
    """(values - empty) / (full - empty).

    Refuses |full - empty| <= ``resolution`` (and so full == empty), where f is undefined or would
    be rounding noise divided by rounding noise.
    """
    full, empty = float(full), float(empty)
    if not (math.isfinite(full) and math.isfinite(empty)):
        raise ValueError(f"faithfulness needs finite metrics of the full and empty circuits, got {full} and {empty}")
    if abs(full - empty) <= resolution:
        raise ValueError(f"the full and empty circuits' metrics ({full} and {empty}) differ by no more than "
                         f"{resolution:.3g}: faithfulness is undefined (the corruption does not change the metric "
                         "beyond float rounding)")
    return (values - empty) / (full - empty)


def trapezoid(x: Sequence[float], y: Sequence[float]) -> float:
    """The trapezoidal rule's area under y(x) over the points given (x increasing)."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} points and y {len(y)}")
    return sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1))


@dataclass
class FaithfulnessCurve:
    """A sweep of circuit sizes. ``cpr`` and ``cmd`` are areas over ``fractions`` (the x axis)."""

    sizes: list  # edges in each circuit, increasing
    fractions: list  # the x axis: each size as a fraction of the graph's edges
    faithfulness: Tensor  # [size] float64, on the CPU
    values: Tensor  # [size] the metric of each circuit (mean over prompts)
    full: float  # the metric of the full circuit (the clean run)
    empty: float  # the metric of the empty circuit (the corrupted run)
    cpr: float
    cmd: float
    n_edges: int

    def smallest_size(self, at_least: float) -> Optional[int]:
        """The smallest size whose faithfulness is >= ``at_least`` (None if none reaches it)."""
        for size, f in zip(self.sizes, self.faithfulness.tolist()):
            if f >= at_least:
                return size
        return None

    def as_dict(self) -> dict:
        return {"sizes": list(self.sizes), "fractions": list(self.fractions),
                "faithfulness": self.faithfulness.tolist(), "values": self.values.tolist(), "full": self.full,
                "empty": self.empty, "cpr": self.cpr, "cmd": self.cmd, "n_edges": self.n_edges}


def edge_counts(sizes: Sequence, n_edges: int) -> tuple:
    """(edge counts, x-axis fractions) of ``sizes`` (fractions as floats, or counts as ints)."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes is empty")
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in sizes):
        raise ValueError(f"sizes must be fractions (floats in [0, 1]) or edge counts (ints), got {sizes!r}")
    floats = [isinstance(s, float) for s in sizes]
    if any(floats) and not all(floats):
        raise ValueError(f"sizes mixes fractions (floats) and edge counts (ints): {sizes!r}; 1 is one edge, 1.0 all")
    if all(floats):
        if any(not 0.0 <= s <= 1.0 for s in sizes):
            raise ValueError(f"fractions of edges must lie in [0, 1], got {sizes!r}")
        counts, fractions = [int(s * n_edges) for s in sizes], [float(s) for s in sizes]
    else:
        if any(not 0 <= s <= n_edges for s in sizes):
            raise ValueError(f"edge counts must lie in [0, n_edges={n_edges}], got {sizes!r}")
        counts, fractions = list(sizes), [s / n_edges for s in sizes]
    if any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise ValueError(f"sizes must increase strictly, got {sizes!r}")
    return counts, fractions


def faithfulness_curve(model, graph, clean_tokens, corrupted_tokens, metric: Callable,
                       sizes: Sequence = MIB_FRACTIONS, *, absolute: bool = True,
                       attention_mask: Optional[Tensor] = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                       progress: bool = False) -> FaithfulnessCurve:
    """Faithfulness of the graph's top-k circuits for every size, with CPR and CMD.

    Args:
        graph: a ``Graph`` over this model's senders and receivers, with a score on every edge.
        sizes: fractions of the edges (floats) or edge counts (ints), increasing; MIB's by default.
        absolute: rank edges by |score| (MIB's default) or by signed score.
        Others as ``evaluate_circuit``; every circuit, the full and the empty one run in one batched call.
    """
    if list(graph.senders) != edges.senders(model.cfg) or list(graph.receivers) != edges.receivers(model.cfg):
        raise ValueError("the graph's senders/receivers are not this model's (edges.senders / edges.receivers of "
                         "model.cfg, in that order)")
    n_edges = graph.n_edges
    counts, fractions = edge_counts(sizes, n_edges)
    circuits = [graph.top_k(k, absolute).in_circuit for k in counts]
    exists = graph.edge_mask()
    masks = torch.stack(circuits + [exists, torch.zeros_like(exists)])
    values = evaluate_circuit(model, clean_tokens, corrupted_tokens, metric, masks, attention_mask=attention_mask,
                              memory_budget=memory_budget, progress=progress).detach().to("cpu", torch.float64)
    full, empty = float(values[-2]), float(values[-1])
    # Below this the two ends are one value up to rounding: 32 ulps of the model's dtype at the larger end
    # (bfloat16 on the shipped model's story: 2.0, against a clean-corrupted gap of 9.7).
    resolution = 32 * torch.finfo(model.embed.W_E.dtype).eps * max(1.0, abs(full), abs(empty))
    f = faithfulness(values[:-2], full, empty, resolution)
    return FaithfulnessCurve(sizes=counts, fractions=fractions, faithfulness=f, values=values[:-2], full=full,
                             empty=empty, cpr=trapezoid(fractions, f.tolist()),
                             cmd=trapezoid(fractions, (1 - f).abs().tolist()), n_edges=n_edges)
