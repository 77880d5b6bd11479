"""The strongest paths into a logit node, for printing: a beam search from the logit back to the nodes
without inputs (tokens, errors), each step scored by the edge's share of its target's |inputs| (the
normalised adjacency influence uses), a path's score the product."""

import torch

from .prune import normalized


def top_paths(graph, logit: int = 0, k: int = 5, beam: int = 20, mask=None) -> list:
    """[(score, [node indices from source to the logit])], best first; ``mask`` [n_nodes n_nodes] limits the edges."""
    A = graph.adjacency if mask is None else graph.adjacency * mask
    An = normalized(A)
    start = graph.logit_index(logit)
    frontier, done = [(1.0, [start])], []
    while frontier:
        grown = []
        for score, path in frontier:
            row = An[path[0]]
            if not row.any():
                done.append((score, path))
                continue
            vals, idx = row.topk(min(beam, int((row > 0).sum())))
            grown += [(score * float(v), [int(i)] + path) for v, i in zip(vals, idx)]
        grown.sort(key=lambda sp: -sp[0])
        frontier = grown[:beam]  # each step goes to an earlier layer: at most n_layers + 2 steps
    return sorted(done, key=lambda sp: -sp[0])[:k]


def node_label(graph, i: int, token_strings, logit_strings) -> str:
    kind = graph.node_kind(i)
    if kind == "feature":
        l, p, f = graph.active_features[i].tolist()
        return f"L{l} feature {f} @{p}"
    if kind == "error":
        l, p = graph.node_layer_pos(i)
        return f"L{l} error @{p}"
    if kind == "token":
        p = i - graph.token_start
        return f"token {token_strings[p]!r} @{p}"
    return f"logit {logit_strings[i - graph.logit_start]!r}"
