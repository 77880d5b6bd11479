"""Trace the induction circuit of glassbox-austen at feature level with an attribution graph.

    PYTHONPATH=. python examples/induction_graph.py [--transcoders NAME_OR_DIR]

``--transcoders`` is a shipped set (default ``glassbox-austen-plt``, per-layer; ``glassbox-austen-clt``,
cross-layer) or a folder (circuit-tracer's layout or SAELens transcoder folders). The prompt
repeats " letter": "Elizabeth read the letter. Then Elizabeth read the" predicts " letter" by induction.
Prints the graph's size, the top paths into the top logit, and where the logit's direct input from the
token embeddings comes from: with frozen attention the embedding of the earlier " letter" reaches the
last position through the induction head, so it should lead the token nodes.
"""

import argparse

import torch

from glassbox import HookedTransformer
from glassbox.interp.graphs import attribute
from glassbox.interp.graphs.paths import node_label, top_paths
from glassbox.interp.graphs.prune import graph_scores, prune_graph
from glassbox.interp.transcoders import load_transcoders

PROMPT = "Elizabeth read the letter. Then Elizabeth read the"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transcoders", default="glassbox-austen-plt",
                   help="a shipped set or a transcoder folder (default glassbox-austen-plt)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = HookedTransformer.from_pretrained("glassbox-austen")
    ts = load_transcoders(args.transcoders, model=model)
    graph = attribute(model, ts, PROMPT)
    tokens = [model.tokenizer.decode([t]) for t in graph.tokens.tolist()]
    logits = [model.tokenizer.decode([t]) for t in graph.logit_tokens.tolist()]
    print(graph, f"top logit {logits[0]!r} p={float(graph.logit_probabilities[0]):.3f}")
    rep, comp = graph_scores(graph)
    print(f"replacement score {rep:.3f}, completeness {comp:.3f}")
    pruned = prune_graph(graph)
    print(f"pruned: {int(pruned.node_mask.sum())} nodes, {pruned.kept_influence:.3f} of the influence")
    for score, path in top_paths(graph, 0, k=8):
        print(f"  {score:.4f}  " + " -> ".join(node_label(graph, i, tokens, logits) for i in path))
    row = graph.adjacency[graph.logit_index(0), graph.token_start:graph.logit_start]
    order = row.abs().argsort(descending=True)[:5].tolist()
    print("direct edges from token embeddings into the top logit:")
    for pos in order:
        print(f"  {tokens[pos]!r} @{pos}: {float(row[pos]):+.3f}")


if __name__ == "__main__":
    main()
