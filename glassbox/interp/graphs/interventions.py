"""Interventions on features, measured next to what the graph predicts.

``intervene(graph, run, {(layer, pos, feature): value, ...})`` sets those features' activations (0 ablates;
any other value steers) and reports, for each logit node (demeaned logit: the logit minus the mean logit,
what the graph's logit nodes measure):

- ``direct``: the graph's direct prediction, sum over the set features of (new - old) / old x edge to the logit;
- ``total``: the graph's total prediction, the changes propagated through every feature node in layer order
  (each node's activation moving with its pre-activation, slope 1 while it stays active);
- ``frozen_direct``: the frozen replacement with every other feature held: equals ``direct`` to rounding;
- ``frozen``: the frozen replacement (patterns and norm scales frozen, errors held) with the other features
  recomputed by their encoders: equals ``total`` to rounding while no other feature crosses its threshold
  (or leaves a TopK set); ``crossed`` counts those that did;
- ``live``: the model itself with the transcoders spliced in (error nodes held), attention and norms live.

The set features must be nodes of the graph (active, outside the excluded positions). Every change is
returned in float64 [n_logits] (on a float32 model its rounding is float32's).
"""

import torch

from .replacement import ReplacementRun


def _demeaned(logits, tokens):
    last = logits[:, -1]
    return last[:, tokens] - last.mean(-1, keepdim=True)


def predicted(graph, changes: dict) -> tuple:
    """(direct, total) change of each logit node for activation changes {node index: delta}."""
    A = graph.adjacency.double()
    n_f = graph.n_features
    a = graph.activation_values.double()
    per_unit = A[:, :n_f] / a  # effect of one unit of each source feature's activation
    delta = torch.zeros(n_f, dtype=torch.float64)
    for i, d in changes.items():
        delta[i] = d
    logits = slice(graph.logit_start, graph.n_nodes)
    direct = per_unit[logits] @ delta
    fixed = torch.zeros(n_f, dtype=torch.bool)
    fixed[list(changes)] = True
    layers = graph.active_features[:, 0]
    for layer in range(graph.n_layers):
        rows = ((layers == layer) & ~fixed).nonzero()[:, 0]
        if len(rows):
            delta[rows] = per_unit[rows] @ delta
    return direct, per_unit[logits] @ delta


@torch.no_grad()
def intervene(graph, run: ReplacementRun, features: dict) -> dict:
    if not isinstance(features, dict) or not features:
        raise ValueError("features must be a non-empty dict {(layer, pos, feature): activation}")
    changes = {}
    for key, value in features.items():
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, int) for k in key)):
            raise ValueError(f"feature key {key!r} must be a (layer, pos, feature) tuple of ints")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or abs(value) == float("inf"):
            raise ValueError(f"feature {key}: the activation must be a finite number, got {value!r}")
        i = graph.feature_index(*key)
        changes[i] = float(value) - float(graph.activation_values[i])
    direct, total = predicted(graph, changes)
    acts = run.acts.clone()
    for (l, p, f), v in features.items():
        acts[l, p, f] = v
    tokens = graph.logit_tokens.to(run.logits.device)
    clean = _demeaned(run.logits[None], tokens)[0].double()
    frozen_direct = run.frozen_forward(acts=acts[None])
    frozen = run.frozen_forward(recompute=True, overrides=features)
    live = run.frozen_forward(live=True, recompute=True, overrides=features)
    before = run.acts != 0
    after = frozen["acts"][0] != 0
    excl = run.exclude_positions
    crossed = int((before[:, excl:] != after[:, excl:]).sum()) - sum(1 for v in features.values() if v == 0)
    return {"logit_tokens": graph.logit_tokens, "direct": direct, "total": total,
            "frozen_direct": (_demeaned(frozen_direct["logits"], tokens)[0].double() - clean).cpu(),
            "frozen": (_demeaned(frozen["logits"], tokens)[0].double() - clean).cpu(),
            "live": (_demeaned(live["logits"], tokens)[0].double() - clean).cpu(), "crossed": crossed}
