"""Influence and pruning of an attribution graph, with circuit-tracer's rules (``graph.py`` there).

- ``normalized(adjacency)``: |A| with each row divided by its sum (rows of zeros stay zero);
- ``influence(An, weights)``: weights @ (An + An^2 + ...), summed until the product is zero (the graph is a
  DAG, so it ends after at most its depth in steps). Node influence uses the logit probabilities as the
  weights on the logit nodes. Influence is conserved: every node with inputs passes its influence plus
  weight on to its sources in proportion to |edge|, so the influence reaching the nodes without inputs
  (tokens, errors, features whose row is zero) adds up to the total logit weight (tested);
- ``prune_graph(graph, node_threshold=0.8, edge_threshold=0.98)``: keep the nodes holding that share of
  the total node influence (tokens and logits always), then the edges holding that share of edge
  influence on the kept subgraph, then drop feature and error nodes left without outgoing edges and
  features left without incoming ones, repeating until nothing changes. ``kept_influence`` reports the
  share of the total node influence held by the kept nodes.
"""

from typing import NamedTuple

import torch
from torch import Tensor


def normalized(matrix: Tensor) -> Tensor:
    m = matrix.abs()
    return m / m.sum(1, keepdim=True).clamp(min=1e-10)


def influence(An: Tensor, weights: Tensor, max_iter: int = 1000) -> Tensor:
    step = weights @ An
    total = step.clone()
    for _ in range(max_iter):
        if not step.any():
            return total
        step = step @ An
        total += step
    raise RuntimeError(f"influence did not vanish after {max_iter} steps: the adjacency has a cycle")


def logit_weights(graph) -> Tensor:
    w = torch.zeros(graph.n_nodes, dtype=graph.adjacency.dtype)
    w[graph.logit_start:] = graph.logit_probabilities.to(w.dtype)
    return w


def node_influence(graph) -> Tensor:
    return influence(normalized(graph.adjacency), logit_weights(graph))


def edge_influence(matrix: Tensor, weights: Tensor) -> Tensor:
    An = normalized(matrix)
    reach = influence(An, weights) + weights
    return An * reach[:, None]


def find_threshold(scores: Tensor, share: float) -> Tensor:
    """The score above which the largest scores hold ``share`` of the total."""
    ordered = scores.sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum()
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]


class PruneResult(NamedTuple):
    node_mask: Tensor  # [n_nodes] bool
    edge_mask: Tensor  # [n_nodes n_nodes] bool, as the adjacency (rows targets)
    cumulative_scores: Tensor  # [n_nodes]: the share of node influence held by the nodes at least as influential
    kept_influence: float  # share of the total node influence held by the kept nodes


def prune_graph(graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PruneResult:
    for name, v in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
    A, w = graph.adjacency, logit_weights(graph)
    n_keep_always = graph.n_logits + graph.n_pos  # tokens and logits, the last nodes
    inf = influence(normalized(A), w)
    node_mask = inf >= find_threshold(inf, node_threshold)
    node_mask[-n_keep_always:] = True
    pruned = A.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    scores = edge_influence(pruned, w)
    edge_mask = scores >= find_threshold(scores.flatten(), edge_threshold)
    n_f, tail = graph.n_features, graph.n_nodes - n_keep_always

    def trim():
        node_mask[:tail] &= edge_mask[:, :tail].any(0)  # features and errors need an outgoing edge
        node_mask[:n_f] &= edge_mask[:n_f].any(1)  # features need an incoming edge

    before = node_mask.clone()
    trim()
    while not torch.equal(node_mask, before):
        before.copy_(node_mask)
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        trim()
    ordered, order = inf.sort(descending=True)
    cumulative = torch.zeros_like(inf)
    cumulative[order] = ordered.cumsum(0) / ordered.sum()
    kept = float(inf[node_mask].sum() / inf.sum()) if inf.sum() > 0 else 1.0
    return PruneResult(node_mask, edge_mask, cumulative, kept)


def graph_scores(graph) -> tuple:
    """circuit-tracer's (replacement score, completeness score): the share of the tokens' and errors'
    influence that is the tokens', and the influence-weighted share of incoming edge weight not from errors."""
    w = logit_weights(graph)
    An = normalized(graph.adjacency)
    inf = influence(An, w)
    errors = slice(graph.error_start, graph.token_start)
    tokens = inf[graph.token_start:graph.logit_start].sum()
    replacement = tokens / (tokens + inf[errors].sum())
    non_error = 1 - An[:, errors].sum(1)
    out = inf + w
    return float(replacement), float((non_error * out).sum() / out.sum())
