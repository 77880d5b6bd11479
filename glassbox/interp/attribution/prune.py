"""Greedy circuit pruning in the manner of ACDC (Conmy et al., 2023), on the exact evaluator.

``prune_circuit(model, clean, corrupted, metric, threshold)`` starts from a circuit (every edge by
default) and visits the receivers from the logits backwards (the reverse of ``edges.receivers``'s
forward order). At each receiver r it considers r's in-circuit edges one at a time and removes an
edge e when that changes the metric by less than the threshold:

    |m(C without e) - m(C)| < threshold        (C: the circuit as it is at that moment)

which is ACDC's rule with the metric's mean over prompts as the score (pass a ``Normalized`` metric
for a threshold in units of the clean-corrupted gap). The edges into r are taken in increasing
order of their single-removal effect at the moment the receiver is reached (ties in forward order),
so that the harmless ones go first.

Batched and still exactly sequential: one pass evaluates every candidate's single removal, to order
them; then one pass evaluates the chain of removals C - e1, C - e1 - e2, ... in that order. The
first link whose step changes the metric by threshold or more is where the sequential rule keeps
its edge: the links before it are accepted, the rejected edge stays, and the chain restarts after it
from the accepted circuit. When the first link is rejected, the circuit has not changed, so every
later candidate (whose single-removal effect is at least as large) is rejected too. A chain
restarts after each rejected edge, so a receiver costs one batched evaluation plus one per rejected
edge at most (rejections while the circuit is still the one of the ordering pass end the receiver
at once), and every decision is the one the one-edge-at-a-time procedure would take, up to float
rounding of the metric near the threshold.
"""

from typing import Callable, Optional

import torch
from torch import Tensor

from .circuit import (DEFAULT_MEMORY_BUDGET, CircuitRun, as_masks, check_arguments, check_model, circuit_flags,
                      prepare_tokens)
from ..patching.metrics import VariantMetric
from .graph import Graph


def prune_circuit(model, clean_tokens, corrupted_tokens, metric: Callable, threshold: float, *, start=None,
                  attention_mask: Optional[Tensor] = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                  progress: bool = False) -> Graph:
    """Remove every edge whose removal moves the metric by less than ``threshold`` (ACDC's greedy rule).

    Args:
        threshold: the largest change of the metric (mean over prompts, in the metric's units) a removal
            may cause; >= 0. 0 removes nothing; inf removes every edge.
        start: the circuit to prune: a bool mask [n_senders n_receivers] or a Graph with a circuit;
            None: every edge.
        Others as ``evaluate_circuit`` (one PositionMetric or per-row metric; not a VariantMetric).

    Returns:
        A ``Graph`` whose ``in_circuit`` is the pruned circuit and whose ``scores`` are, for each edge
        considered, the signed change ``m(C without e) - m(C)`` measured when it was decided (NaN for
        edges outside the starting circuit). ``metadata`` holds the method, the threshold, the metric
        of the starting and of the pruned circuit, and the number of circuits evaluated.
    """
    threshold = float(threshold)
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0 (a change of the metric), got {threshold}")
    check_arguments(metric, memory_budget)
    if isinstance(metric, VariantMetric):
        raise TypeError("prune_circuit takes a metric with one value per row (e.g. LogitDiff), not a VariantMetric")
    check_model(model)
    clean, corrupted, key_mask = prepare_tokens(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    with circuit_flags(model):
        run = CircuitRun(model, clean, corrupted, key_mask)
        exists = run.exists
        if start is None:
            circuit = exists.clone()
        else:
            masks, single = as_masks(model, start)
            if masks.shape[0] != 1:
                raise ValueError(f"start must be one circuit (a mask [senders receivers] or one Graph), got a stack "
                                 f"of {masks.shape[0]}")
            circuit = masks[0] & exists
        n_start = int(circuit.sum())
        pruner = Pruner(run, metric, memory_budget, threshold)
        initial = pruner.value(circuit[None])[0]
        value = initial
        changes = torch.full(exists.shape, float("nan"), dtype=torch.float64)
        from tqdm.auto import tqdm

        for r in tqdm(reversed(range(len(run.receivers))), total=len(run.receivers), desc="pruning receivers",
                      disable=not progress, leave=False):
            circuit, value = pruner.prune_receiver(circuit, value, r, changes)
    metadata = {"method": "greedy pruning (ACDC rule, exact evaluation)", "threshold": threshold,
                "metric": getattr(metric, "name", type(metric).__name__), "metric_start": initial,
                "metric_pruned": value, "n_evaluated": pruner.n_evaluated, "n_batches": pruner.n_batches,
                "n_edges_start": n_start, "n_edges_pruned": int(circuit.sum()),
                "model": getattr(model.cfg, "model_name", "custom")}
    return Graph(run.senders, run.receivers, changes.float().cpu(), metadata, in_circuit=circuit.cpu())


class Pruner:
    def __init__(self, run: CircuitRun, metric: Callable, memory_budget: int, threshold: float):
        self.run, self.metric, self.memory_budget, self.threshold = run, metric, memory_budget, threshold
        self.n_evaluated, self.n_batches = 0, 0

    def value(self, masks: Tensor) -> list:
        """The metric (mean over prompts, float64 on the CPU) of each circuit of a [mask S R] stack."""
        self.n_evaluated += masks.shape[0]
        self.n_batches += 1
        out = self.run.evaluate(masks, self.metric, self.memory_budget, False)
        return out.mean(1).to("cpu", torch.float64).tolist()

    def prune_receiver(self, circuit: Tensor, value: float, r: int, changes: Tensor) -> tuple:
        """Apply the rule to the in-circuit edges into receiver ``r``; (circuit, its metric)."""
        candidates = circuit[:, r].nonzero().reshape(-1).tolist()
        if not candidates:
            return circuit, value
        singles = self.value(torch.stack([drop(circuit, [s], r) for s in candidates]))
        effect = {s: v - value for s, v in zip(candidates, singles)}
        order = sorted(candidates, key=lambda s: abs(effect[s]))  # stable: ties keep forward order
        fresh = True  # the circuit is still the one the single-removal effects were measured on
        while order:
            if fresh and abs(effect[order[0]]) >= self.threshold:
                # Sorted: every remaining single-removal effect is at least as large. All stay.
                for s in order:
                    changes[s, r] = effect[s]
                return circuit, value
            chain = [drop(circuit, order[:j + 1], r) for j in range(len(order))]
            values = self.value(torch.stack(chain))
            previous, stop = value, len(order)
            for j, v in enumerate(values):
                changes[order[j], r] = v - previous
                if abs(v - previous) >= self.threshold:
                    stop = j
                    break
                previous = v
            if stop == len(order):  # every link accepted
                return chain[-1], values[-1]
            if stop > 0:
                circuit, value, fresh = chain[stop - 1], values[stop - 1], False
            order = order[stop + 1:]
        return circuit, value


def drop(circuit: Tensor, senders: list, r: int) -> Tensor:
    """A copy of ``circuit`` without the edges senders -> r."""
    out = circuit.clone()
    out[senders, r] = False
    return out
