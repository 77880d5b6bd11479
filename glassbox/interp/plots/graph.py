"""The circuit graph: a figure of an edge-attribution ``Graph`` and its offline page.

Layout, bottom to top: ``input``; then per layer L a row of heads ``a{L}.h{H}`` (left to right,
centred on x = 0) and above it a row holding the MLP ``m{L}`` (one place right of the last head);
``logits`` on top. Input and logits sit at x = 0. A head's three inputs (its
query, key and value receivers) are small ports just below it, left to right q, k, v; a shared key or
value input of grouped-query attention (``a{L}.kv{G}.k``) sits below the middle of the heads that
share it. An edge runs from its sender's node to its receiver's port.

Edges: width grows with |score| (relative to the largest drawn), blue for a positive score, red for
a negative one. When ``graph.in_circuit`` is set, the circuit's edges are drawn in colour and the
strongest edges outside it fill the remaining ``max_edges`` places in grey; otherwise the
``max_edges`` strongest edges are drawn in colour. Every edge is its own trace (named
``"sender -> receiver"``, with ``meta`` holding sender, receiver, score and in_circuit), and one marker
trace at the edges' midpoints carries the hover: sender -> receiver and the score.

Footguns: a GPT-2-small graph has ~32,000 edges; drawing them all makes a slow page, so
``max_edges`` caps what is drawn (the caption says how many of how many). An edge whose score is
NaN (left unscored) is not drawn; an infinite score is refused. Hover sits on the edge's
midpoint, not along the whole line. plotly.js is inlined, so the page is ~5 MB.
"""

import html
import math
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

from ...fs import write_text
from ..attribution.edges import edge_mask_for, receiver_node, sender_position
from .common import escape, go
from .html import page as html_page

POSITIVE, NEGATIVE, OUTSIDE = "#2166ac", "#b2182b", "#b0b0b0"
WIDTH = (0.6, 9.0)  # line width of the weakest and of the strongest edge drawn
PORT_DROP = 0.3     # how far below its head a q/k/v port sits (rows are 1 apart)
PORT_SPREAD = 0.22  # horizontal offset of the q and v ports from the head
_HEAD = re.compile(r"^a(\d+)\.h(\d+)$")
_KV = re.compile(r"^a(\d+)\.kv(\d+)$")


def _row(name: str, n_layers: int) -> float:
    """y of a node: input 0, heads of layer L at 2L+1, MLP L at 2L+2, logits at 2 n_layers + 1."""
    if name == "input":
        return 0.0
    if name == "logits":
        return 2.0 * n_layers + 1
    layer, part = sender_position(name) if not _KV.match(name) else (int(_KV.match(name).group(1)), 0)
    return 2.0 * layer + 1 + part


def layout_positions(senders: Sequence[str], receivers: Sequence[str]) -> tuple:
    """(node -> (x, y), receiver -> (x, y) of its port) for a graph's names (see the module docstring)."""
    heads: dict = {}
    layers = set()
    for name in list(senders) + [receiver_node(r) for r in receivers]:
        match = _HEAD.match(name)
        if match:
            heads.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
        if name not in ("input", "logits"):
            layers.add(_layer_of(name))
    n_layers = max(layers) + 1 if layers else 0
    width = max((max(h) + 1 for h in heads.values()), default=1)
    centre = (width - 1) / 2
    kv_groups: dict = {}
    for name in receivers:
        match = _KV.match(receiver_node(name))
        if match:
            kv_groups.setdefault(int(match.group(1)), set()).add(int(match.group(2)))

    nodes: dict = {}
    for name in list(senders) + [receiver_node(r) for r in receivers]:
        if name in nodes:
            continue
        head, kv = _HEAD.match(name), _KV.match(name)
        if head:
            x = int(head.group(2)) - centre
        elif kv:
            n_groups = max(kv_groups[int(kv.group(1))]) + 1
            per_group = width / n_groups
            x = (int(kv.group(2)) + 0.5) * per_group - 0.5 - centre
        elif name.startswith("m"):
            x = centre + 1.0  # right of the heads, so the MLP does not sit on a head's vertical edges
        else:
            x = 0.0
        nodes[name] = (x, _row(name, n_layers))
    ports = {}
    for name in receivers:
        x, y = nodes[receiver_node(name)]
        part = name.rsplit(".", 1)[-1] if name.startswith("a") else None
        if part is None:  # an MLP's or the logits' input: just below the node
            ports[name] = (x, y - PORT_DROP / 2)
        elif _KV.match(receiver_node(name)):
            ports[name] = (x + (-PORT_SPREAD / 2 if part == "k" else PORT_SPREAD / 2), y - PORT_DROP)
        else:
            ports[name] = (x + {"q": -PORT_SPREAD, "k": 0.0, "v": PORT_SPREAD}[part], y - PORT_DROP)
    return nodes, ports


def _layer_of(node: str) -> int:
    kv = _KV.match(node)
    return int(kv.group(1)) if kv else sender_position(node)[0]


def drawn_edges(graph, max_edges: int) -> tuple:
    """(edges to draw, n existing edges, n in the circuit): edges are (sender, receiver, score,
    in_circuit), the circuit's first, each group by |score| descending, at most ``max_edges``."""
    if not isinstance(max_edges, int) or isinstance(max_edges, bool) or max_edges < 1:
        raise ValueError(f"max_edges must be a whole number >= 1, got {max_edges!r}")
    senders, receivers = list(graph.senders), list(graph.receivers)
    scores = graph.scores.detach().to("cpu", torch.float64)
    if tuple(scores.shape) != (len(senders), len(receivers)):
        raise ValueError(f"graph.scores has shape {tuple(scores.shape)}; expected [n_senders n_receivers] = "
                         f"[{len(senders)} {len(receivers)}]")
    exists = edge_mask_for(senders, receivers)
    bad = exists & torch.isinf(scores)
    if bad.any():
        s, r = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"edge {senders[s]} -> {receivers[r]} has score {scores[s, r].item()}; an edge's width "
                         "needs a finite score")
    if graph.in_circuit is not None:
        circuit = graph.in_circuit.detach().to("cpu", torch.bool)
        if tuple(circuit.shape) != tuple(scores.shape):
            raise ValueError(f"graph.in_circuit has shape {tuple(circuit.shape)}, graph.scores {tuple(scores.shape)}")
        if (circuit & ~exists).any():
            s, r = (int(i) for i in (circuit & ~exists).nonzero()[0])
            raise ValueError(f"graph.in_circuit holds {senders[s]} -> {receivers[r]}, which is not an edge")
    else:
        circuit = torch.zeros_like(exists)

    def ranked(mask: torch.Tensor) -> list:
        idx = mask.nonzero()
        if not len(idx):
            return []
        values = scores[idx[:, 0], idx[:, 1]]
        order = torch.argsort(values.abs(), descending=True, stable=True)
        return [(senders[int(idx[i, 0])], receivers[int(idx[i, 1])], float(values[i]),
                 bool(circuit[idx[i, 0], idx[i, 1]])) for i in order.tolist()]

    scored = exists & ~torch.isnan(scores)  # NaN: an edge left unscored, not drawn
    inside = ranked(scored & circuit)[:max_edges]
    outside = ranked(scored & ~circuit)[:max_edges - len(inside)]
    return inside + outside, int(exists.sum()), int(circuit.sum())


def circuit_plot(graph, max_edges: int = 200, title: Optional[str] = None):
    """The figure of ``graph`` (see the module docstring): edges by |score| and sign over the nodes
    laid out by layer; ``max_edges`` caps how many edges are drawn."""
    edges, n_edges, n_circuit = drawn_edges(graph, max_edges)
    nodes, ports = layout_positions(graph.senders, graph.receivers)
    has_circuit = graph.in_circuit is not None
    biggest = max((abs(e[2]) for e in edges), default=0.0) or 1.0
    Scatter = go().Scatter
    traces = []
    # Grey context first, then the coloured edges weakest to strongest, so the strongest lie on top.
    for sender, receiver, score, inside in sorted(edges, key=lambda e: (e[3] or not has_circuit, abs(e[2]))):
        (x0, y0), (x1, y1) = nodes[sender], ports[receiver]
        coloured = inside or not has_circuit
        width = WIDTH[0] + (WIDTH[1] - WIDTH[0]) * abs(score) / biggest
        traces.append(Scatter(
            x=[x0, x1], y=[y0, y1], mode="lines", name=f"{sender} -> {receiver}", showlegend=False,
            hoverinfo="skip", opacity=0.8 if coloured else 0.45,
            line=dict(width=width, color=(POSITIVE if score >= 0 else NEGATIVE) if coloured else OUTSIDE),
            meta=dict(kind="edge", sender=sender, receiver=receiver, score=score, in_circuit=inside)))
    traces.append(Scatter(
        x=[(nodes[s][0] + ports[r][0]) / 2 for s, r, _, _ in edges],
        y=[(nodes[s][1] + ports[r][1]) / 2 for s, r, _, _ in edges],
        mode="markers", name="edge scores", showlegend=False, marker=dict(size=7, color="rgba(0,0,0,0.01)"),
        customdata=[[s, r, score] for s, r, score, _ in edges],
        hovertemplate="%{customdata[0]} -> %{customdata[1]}<br>score %{customdata[2]:.4g}<extra></extra>",
        meta=dict(kind="edge_hover")))
    in_nodes = {n for s, r, _, inside in edges if inside for n in (s, receiver_node(r))}
    names = list(nodes)
    traces.append(Scatter(
        x=[nodes[n][0] for n in names], y=[nodes[n][1] for n in names], mode="markers+text", name="nodes",
        showlegend=False, text=[escape(n) for n in names], textposition="top center", textfont=dict(size=11),
        customdata=names,
        hovertemplate="%{customdata}<extra></extra>",
        marker=dict(size=16, symbol=["square" if n.startswith("m") else "circle" for n in names],
                    color=["#222222" if (n in in_nodes or not has_circuit) else "#dddddd" for n in names],
                    line=dict(width=1, color="#555555")),
        meta=dict(kind="nodes")))
    port_names = list(ports)
    traces.append(Scatter(
        x=[ports[p][0] for p in port_names], y=[ports[p][1] for p in port_names], mode="markers", name="inputs",
        showlegend=False, customdata=port_names, hovertemplate="%{customdata}<extra></extra>",
        marker=dict(size=5, color="#777777"), meta=dict(kind="ports")))
    fig = go().Figure(traces)
    n_rows = max(y for _, y in nodes.values()) + 1 if nodes else 1
    left = min((x for x, _ in nodes.values()), default=-1.0)
    right = max((x for x, _ in nodes.values()), default=1.0)
    fig.update_layout(
        title=title if title is not None else escape(caption(graph, len(edges), n_edges, n_circuit)),
        height=int(min(2400, max(500, 70 * n_rows))), plot_bgcolor="white", hovermode="closest",
        xaxis=dict(visible=False, range=[left - 0.8, right + 0.8]),
        yaxis=dict(visible=False, range=[-0.6, n_rows - 0.4]), margin=dict(l=20, r=20, t=60, b=20))
    return fig


def caption(graph, n_shown: int, n_edges: int, n_circuit: int, faithfulness: Optional[float] = None) -> str:
    """One line: method (and steps), metric, model, edges shown of how many, faithfulness when given,
    and how to read an edge's colour and width."""
    meta = dict(graph.metadata or {})
    parts = []
    method = meta.get("method")
    if method:
        steps = meta.get("steps")
        parts.append(f"{method}" + (f" ({steps} steps)" if steps not in (None, 1) and method != "EAP" else ""))
    for key in ("metric", "model"):
        if meta.get(key):
            parts.append(f"{key} {meta[key]}")
    shown = f"{n_shown:,} of {n_edges:,} edges shown"
    if graph.in_circuit is not None:
        shown += f", {n_circuit:,} in the circuit (coloured; the others grey)"
    parts.append(shown)
    if faithfulness is not None:
        parts.append(f"faithfulness {float(faithfulness):.3f}")
    parts.append("edges: blue score > 0, red < 0, width |score|")
    return "; ".join(parts)


def curve_plot(curve: Union[Mapping, Sequence]):
    """Faithfulness against circuit size: ``{n_edges: faithfulness}`` or (n_edges, faithfulness) pairs."""
    pairs = sorted((curve.items() if isinstance(curve, Mapping) else curve), key=lambda p: p[0])
    xs, ys = [int(p[0]) for p in pairs], [float(p[1]) for p in pairs]
    fig = go().Figure(go().Scatter(x=xs, y=ys, mode="lines+markers", name="faithfulness",
                                   hovertemplate="%{x} edges: faithfulness %{y:.4f}<extra></extra>",
                                   meta=dict(kind="faithfulness")))
    fig.update_layout(title="faithfulness against circuit size", xaxis=dict(title="edges in the circuit", type="log"),
                      yaxis=dict(title="faithfulness (1 = the full model)", zeroline=True), height=380)
    return fig


BODY = """<p class="caption" id="caption">{caption}</p>
{graph}
{curve}
"""


def circuit_page(graph, path: Optional[Union[str, Path]] = None, title: str = "circuit", max_edges: int = 200,
                 faithfulness: Optional[float] = None, curve: Optional[Union[Mapping, Sequence]] = None) -> str:
    """The offline page of ``graph``: a caption (method, metric, model, edges shown, ``faithfulness``
    when given), the graph figure (div id ``circuit``) and, when ``curve`` is given, faithfulness
    against circuit size (div id ``faithfulness``). plotly.js is inlined; nothing is fetched.
    Writes the page to ``path`` when given; returns it."""
    if faithfulness is not None and not math.isfinite(float(faithfulness)):
        raise ValueError(f"faithfulness must be a finite number, got {faithfulness!r}")
    edges, n_edges, n_circuit = drawn_edges(graph, max_edges)
    text = caption(graph, len(edges), n_edges, n_circuit, faithfulness)
    fig = circuit_plot(graph, max_edges=max_edges, title="")  # the page's <h1> holds the title
    parts = dict(graph=fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, div_id="circuit"),
                 curve="" if curve is None else curve_plot(curve).to_html(
                     full_html=False, include_plotlyjs=False, include_mathjax=False, div_id="faithfulness"))
    page = html_page(title, BODY.format(caption=html.escape(text), **parts))
    if path is not None:
        write_text(path, page)  # written whole (glassbox.fs)
    return page
