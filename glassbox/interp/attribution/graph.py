"""Graph: edge scores between the senders and receivers of a model, and a circuit chosen among them.

``scores[s, r]`` is the score of the edge ``senders[s] -> receivers[r]`` (float32), NaN where no
edge exists (which ``edges.edge_exists`` decides from the names alone); ``in_circuit`` is None or a
bool mask of the same shape that is False wherever no edge exists. Both are checked on construction.

Contracts and footguns:
- Ordering. ``edges()`` sorts by |score| (or score) descending; ties, and NaN scores (which sort
  last), keep forward order (sender-major, then receiver), so a ranking is deterministic.
- ``top_k`` and ``threshold`` return a copy; the graph they are called on is unchanged. ``top_k``
  never picks an edge whose score is NaN and refuses k larger than the number of scored edges.
- ``threshold(t)`` keeps the edges with |score| >= t (or score >= t when ``absolute=False``).
- ``nodes_in_circuit`` lists the endpoints of in-circuit edges; a receiver counts as its node
  ("a1.h0.q" -> "a1.h0", "a1.kv0.k" -> "a1.kv0"). It does not prune nodes that do not reach the
  logits.
- JSON: ``to_json`` gives a dict that ``json.dumps(..., allow_nan=False)`` accepts (a NaN score is
  ``null``; an infinite score, and senders/receivers that are not one model's complete lists, are
  refused); float32 scores round-trip exactly. ``metadata`` must be JSON-serialisable for
  ``save_json``. Reading is strict (``graph_json.py`` states the format): a damaged, hand-edited or
  incomplete file is refused, naming the file and the first bad entry, never read as another graph.
"""

import copy
import json
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from ...fs import write_text
from . import graph_json
from .edges import check_names, edge_mask_for, nodes, receiver_node
from .graph_json import JSON_FORMAT, JSON_VERSION


@dataclass
class Graph:
    senders: list
    receivers: list
    scores: Tensor
    metadata: dict = field(default_factory=dict)
    in_circuit: Optional[Tensor] = None

    def __post_init__(self):
        self.senders, self.receivers = list(self.senders), list(self.receivers)
        check_names(self.senders, self.receivers)
        shape = (len(self.senders), len(self.receivers))
        if not isinstance(self.scores, Tensor) or tuple(self.scores.shape) != shape:
            got = tuple(self.scores.shape) if isinstance(self.scores, Tensor) else type(self.scores).__name__
            raise ValueError(f"Graph.scores must be a tensor of shape [n_senders, n_receivers] = {shape}, got {got}")
        if not self.scores.dtype.is_floating_point:
            raise ValueError(f"Graph.scores must be floating point, got {self.scores.dtype}")
        self.scores = self.scores.detach().to(torch.float32)
        mask = self.edge_mask()
        bad = ~mask & ~torch.isnan(self.scores)
        if bad.any():
            s, r = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"Graph.scores has a value at ({self.senders[s]!r} -> {self.receivers[r]!r}), which is "
                             "not an edge (the sender is not upstream of the receiver); it must be NaN there")
        if self.in_circuit is not None:
            if not isinstance(self.in_circuit, Tensor) or self.in_circuit.dtype != torch.bool \
                    or tuple(self.in_circuit.shape) != shape:
                raise ValueError(f"Graph.in_circuit must be None or a bool tensor of shape {shape}")
            self.in_circuit = self.in_circuit.detach().to(self.scores.device)
            if (self.in_circuit & ~mask).any():
                s, r = (int(i) for i in (self.in_circuit & ~mask).nonzero()[0])
                raise ValueError(f"Graph.in_circuit marks ({self.senders[s]!r} -> {self.receivers[r]!r}), which is "
                                 "not an edge")
        if not isinstance(self.metadata, dict):
            raise ValueError(f"Graph.metadata must be a dict, got {type(self.metadata).__name__}")

    def __repr__(self) -> str:  # counts, the best edges and the circuit, not the scores tensor
        from ..reprs import graph_repr

        return graph_repr(self)

    def _repr_html_(self) -> str:
        from ..reprs import graph_html

        return graph_html(self)

    # --- edges -----------------------------------------------------------------------------------
    def edge_mask(self) -> Tensor:
        """bool [n_senders, n_receivers]: True where the edge exists."""
        return edge_mask_for(self.senders, self.receivers, device=self.scores.device)

    @property
    def n_edges(self) -> int:
        """The number of existing edges (scored or NaN)."""
        return int(self.edge_mask().sum())

    def score(self, sender: str, receiver: str) -> float:
        """The score of one edge (KeyError for a name not in the graph; NaN where no edge exists)."""
        return float(self.scores[self._index(self.senders, sender, "sender"),
                                 self._index(self.receivers, receiver, "receiver")])

    def edges(self, absolute: bool = True) -> list:
        """Every existing edge as (sender, receiver, score), best first (see the module docstring)."""
        order = self._ranked(absolute).tolist()
        flat = self.scores.reshape(-1).cpu().tolist()
        n_r = len(self.receivers)
        return [(self.senders[i // n_r], self.receivers[i % n_r], flat[i]) for i in order]

    def _ranked(self, absolute: bool) -> Tensor:
        """Flat indices of the existing edges, by score descending, NaN last, ties in forward order."""
        flat = self.scores.reshape(-1).cpu()
        idx = self.edge_mask().reshape(-1).cpu().nonzero().reshape(-1)
        nan = torch.isnan(flat[idx])
        scored, unscored = idx[~nan], idx[nan]
        key = flat[scored].abs() if absolute else flat[scored]
        order = torch.sort(key, descending=True, stable=True).indices  # stable: ties keep forward order
        return torch.cat([scored[order], unscored])

    # --- circuits --------------------------------------------------------------------------------
    def top_k(self, k: int, absolute: bool = True) -> "Graph":
        """A copy whose ``in_circuit`` holds the k best-scored edges (k=0: an empty circuit)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k: k must be a non-negative int, got {k!r}")
        order = self._ranked(absolute)
        n_scored = int((~torch.isnan(self.scores.reshape(-1).cpu()[order])).sum())
        if k > n_scored:
            raise ValueError(f"top_k: k={k} is more than the {n_scored} scored edges of this graph")
        chosen = torch.zeros(self.scores.numel(), dtype=torch.bool)
        chosen[order[:k]] = True
        return self._with_circuit(chosen.reshape(self.scores.shape))

    def threshold(self, t: float, absolute: bool = True) -> "Graph":
        """A copy whose ``in_circuit`` holds the edges with |score| >= t (score >= t if not absolute)."""
        t = float(t)
        if t != t:
            raise ValueError("threshold: t is NaN")
        values = self.scores.abs() if absolute else self.scores
        chosen = self.edge_mask() & (values >= t)  # NaN compares False: never chosen
        return self._with_circuit(chosen.cpu())

    def _with_circuit(self, chosen: Tensor) -> "Graph":
        return Graph(list(self.senders), list(self.receivers), self.scores.clone(), copy.deepcopy(self.metadata),
                     chosen.to(self.scores.device))

    def nodes(self) -> list:
        """Every node: the senders, then receiver nodes that are not senders ("a{L}.kv{G}", "logits")."""
        return nodes(self.senders, self.receivers)

    def nodes_in_circuit(self) -> list:
        """The nodes that are an endpoint of an in-circuit edge, in the order of ``nodes()``."""
        if self.in_circuit is None:
            raise ValueError("this graph has no circuit (in_circuit is None): select one with top_k or threshold")
        pairs = self.in_circuit.cpu().nonzero().tolist()
        used = {self.senders[s] for s, _ in pairs} | {receiver_node(self.receivers[r]) for _, r in pairs}
        return [n for n in self.nodes() if n in used]

    # --- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A JSON-ready dict: format, version, senders, receivers, nodes, every existing edge (forward
        order) with its score (null for NaN) and, when a circuit is set, ``in_circuit``; metadata."""
        graph_json.check_writable(self.senders, self.receivers, self.metadata)  # what the reader would refuse
        scores = self.scores.cpu()
        if torch.isinf(scores).any():
            s, r = (int(i) for i in torch.isinf(scores).nonzero()[0])
            raise ValueError(f"Graph.to_json: the score of ({self.senders[s]!r} -> {self.receivers[r]!r}) is "
                             "infinite, which JSON cannot hold")
        circuit = self.in_circuit.cpu().tolist() if self.in_circuit is not None else None
        values = scores.tolist()
        edges = []
        for s, r in self.edge_mask().cpu().nonzero().tolist():
            value = values[s][r]
            edge = {"sender": self.senders[s], "receiver": self.receivers[r],
                    "score": None if value != value else value}
            if circuit is not None:
                edge["in_circuit"] = circuit[s][r]
            edges.append(edge)
        return {"format": JSON_FORMAT, "version": JSON_VERSION, "senders": list(self.senders),
                "receivers": list(self.receivers), "nodes": self.nodes(), "edges": edges,
                "has_circuit": circuit is not None, "metadata": copy.deepcopy(self.metadata)}

    @classmethod
    def from_json(cls, data: dict, model=None) -> "Graph":
        """The graph ``to_json`` wrote, validated strictly (``graph_json.py``); ``model`` (a model or its
        Config), when given, must be the shape the names give."""
        return cls._from_checked(graph_json.check(data, model=model))

    def save_json(self, path) -> None:
        """Write ``to_json()`` to ``path`` (strict JSON: no NaN or Infinity literals) through the crash-safe
        writer (``glassbox.fs``): a reader, or a save that fails or is killed, sees the old file or the new
        one whole. Errors of the OS are OSErrors naming the file; nothing is written if ``to_json`` or
        ``json.dumps`` refuses the graph."""
        write_text(path, json.dumps(self.to_json(), allow_nan=False))

    @classmethod
    def load_json(cls, path, model=None) -> "Graph":
        """The graph in the file at ``path``; errors name the file and the first bad entry. With ``model``
        (a model or its Config) a graph for a model of another shape is refused."""
        return cls._from_checked(graph_json.load(path, model))

    @classmethod
    def _from_checked(cls, parts: dict) -> "Graph":
        shape = (len(parts["senders"]), len(parts["receivers"]))
        circuit = parts["circuit"]
        return cls(parts["senders"], parts["receivers"],
                   torch.tensor(parts["scores"], dtype=torch.float32).reshape(shape), dict(parts["metadata"]),
                   None if circuit is None else torch.tensor(circuit, dtype=torch.bool).reshape(shape))

    @staticmethod
    def _index(names: list, name: str, kind: str) -> int:
        try:
            return names.index(name)
        except ValueError:
            raise KeyError(f"{kind} {name!r} is not in this graph") from None
