"""The circuit graph: a figure of an edge-attribution ``Graph`` and its offline page.

Layout, bottom to top: ``input``; then per layer L a row of heads ``a{L}.h{H}`` (left to right in
head order, centred on x = 0, so a head's place reads as its name) and above it a row holding the
MLP ``m{L}``; ``logits`` on top. Input, MLPs and logits sit at x = 0. A head's three inputs (its
query, key and value receivers) are small ports just below it, left to right q, k, v, labelled; a
shared key or value input of grouped-query attention (``a{L}.kv{G}.k``) sits below the middle of the
heads that share it (each head then has its query port right below it).

Edges are routed so that no edge passes through a node or port it does not touch (``edge_path``): an
edge leaves its sender straight up, crosses the empty band above the sender's row diagonally, passes
each row in between through a lane (a gap between that row's nodes and ports, the one nearest the
straight line from sender to receiver, which keeps crossings few), and enters its port from below.

Edges: width grows with |score| (relative to the largest drawn), blue for a positive score, red for
a negative one. A score estimates the change in the metric when that edge alone carries its sender's
corrupted value (``eap``): red (negative) edges are the ones whose clean values support the answer.
When ``graph.in_circuit`` is set, the circuit's edges are drawn in colour and the
strongest edges outside it fill the remaining ``max_edges`` places in grey; otherwise the
``max_edges`` strongest edges are drawn in colour. Every edge is its own trace (named
``"sender -> receiver"``, with ``meta`` holding sender, receiver, score and in_circuit), and one marker
trace at the edges' midpoints (half-way along each path) carries the hover: sender -> receiver and
the score. The page adds the sign convention in words and a sortable table of the edges (``table_html``).

Footguns: a GPT-2-small graph has ~32,000 edges; drawing them all makes a slow page, so
``max_edges`` caps what is drawn (the caption says how many of how many) and ``max_table`` what the
table lists. An edge whose score is NaN (left unscored) is not drawn; an infinite score is refused.
Hover sits on the edge's midpoint, not along the whole line. plotly.js is inlined, so the page is ~5 MB.
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
EXIT = 0.12         # an edge leaves its sender straight up for this far (rows are 1 apart) ...
ENTRY = 0.42        # ... and enters a row (its port, or a lane through it) from this far below the row
LANE_CLEARANCE = 0.25  # a lane keeps this far (in head places) from every node and port of its row
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
        else:
            x = 0.0  # input, MLPs and logits: centred in their rows (edges route around what is in between)
        nodes[name] = (x, _row(name, n_layers))
    ports = {}
    for name in receivers:
        x, y = nodes[receiver_node(name)]
        part = name.rsplit(".", 1)[-1] if name.startswith("a") else None
        if part is None:  # an MLP's or the logits' input: just below the node
            ports[name] = (x, y - PORT_DROP / 2)
        elif _KV.match(receiver_node(name)):
            ports[name] = (x + (-PORT_SPREAD if part == "k" else PORT_SPREAD), y - PORT_DROP)
        elif _layer_of(receiver_node(name)) in kv_groups:  # grouped: the head's only own port, right below it
            ports[name] = (x, y - PORT_DROP)
        else:
            ports[name] = (x + {"q": -PORT_SPREAD, "k": 0.0, "v": PORT_SPREAD}[part], y - PORT_DROP)
    return nodes, ports


def lanes(nodes: Mapping, ports: Mapping) -> dict:
    """row y -> the x's where an edge may cross that row: half-way between head places (and one place
    beyond each end), farther than LANE_CLEARANCE from every node and port of the row."""
    if not nodes:
        return {}
    xs = sorted({x for x, _ in nodes.values()})
    low, high = min(xs) - 1.0, max(xs) + 1.0
    start = min(xs) - 0.5
    grid = [start + i * 0.5 for i in range(int(round((high - start) / 0.5)) + 1)]
    busy: dict = {}
    for x, y in nodes.values():
        busy.setdefault(y, []).append(x)
    for (x, y) in ports.values():  # a port belongs to the row above it
        busy.setdefault(math.ceil(y - 1e-9), []).append(x)
    return {y: [x for x in grid if all(abs(x - b) > LANE_CLEARANCE for b in busy.get(y, []))] or [low, high]
            for y in {y for _, y in nodes.values()}}


def edge_path(sender_xy: tuple, port_xy: tuple, row_lanes: Mapping) -> tuple:
    """(xs, ys) of the line from a sender's node to a receiver's port: up out of the sender, across the
    free band above its row, up through each row in between at the lane nearest the straight line, and
    up into the port from below. Diagonals lie only in the bands between rows, where nothing is drawn,
    and the vertical pieces only where a row has no node or port, so an edge passes through no node it
    does not touch."""
    (x0, y0), (x1, y1) = sender_xy, port_xy
    row_to = math.ceil(y1 - 1e-9)  # the receiver's row
    xs, ys = [x0, x0], [y0, y0 + EXIT]
    for row in range(int(round(y0)) + 1, row_to):
        t = (row - y0) / (y1 - y0)
        straight = x0 + t * (x1 - x0)
        candidates = row_lanes.get(row)
        lane = min(candidates, key=lambda x: (abs(x - straight), x)) if candidates else straight
        xs += [lane, lane]
        ys += [row - ENTRY, row + EXIT]
    xs += [x1, x1]
    ys += [row_to - ENTRY, y1]
    return xs, ys


def path_middle(xs: list, ys: list) -> tuple:
    """The point half-way along a path, where its hover marker sits."""
    lengths = [math.hypot(xs[i + 1] - xs[i], ys[i + 1] - ys[i]) for i in range(len(xs) - 1)]
    half, walked = sum(lengths) / 2, 0.0
    for i, length in enumerate(lengths):
        if walked + length >= half and length > 0:
            t = (half - walked) / length
            return xs[i] + t * (xs[i + 1] - xs[i]), ys[i] + t * (ys[i + 1] - ys[i])
        walked += length
    return xs[-1], ys[-1]


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
    row_lanes = lanes(nodes, ports)
    paths = {(s, r): edge_path(nodes[s], ports[r], row_lanes) for s, r, _, _ in edges}
    for sender, receiver, score, inside in sorted(edges, key=lambda e: (e[3] or not has_circuit, abs(e[2]))):
        xs, ys = paths[(sender, receiver)]
        coloured = inside or not has_circuit
        width = WIDTH[0] + (WIDTH[1] - WIDTH[0]) * abs(score) / biggest
        traces.append(Scatter(
            x=xs, y=ys, mode="lines", name=f"{sender} -> {receiver}", showlegend=False,
            hoverinfo="skip", opacity=0.8 if coloured else 0.45,
            line=dict(width=width, color=(POSITIVE if score >= 0 else NEGATIVE) if coloured else OUTSIDE),
            meta=dict(kind="edge", sender=sender, receiver=receiver, score=score, in_circuit=inside)))
    middles = [path_middle(*paths[(s, r)]) for s, r, _, _ in edges]
    traces.append(Scatter(
        x=[m[0] for m in middles], y=[m[1] for m in middles],
        mode="markers", name="edge scores", showlegend=False, marker=dict(size=7, color="rgba(0,0,0,0.01)"),
        customdata=[[s, r, score] for s, r, score, _ in edges],
        hovertemplate="%{customdata[0]} -> %{customdata[1]}<br>score %{customdata[2]:.4g}<extra></extra>",
        meta=dict(kind="edge_hover")))
    in_nodes = {n for s, r, _, inside in edges if inside for n in (s, receiver_node(r))}
    names = [n for n in nodes if not _KV.match(n)]  # a kv group is drawn as its ports only
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
        x=[ports[p][0] for p in port_names], y=[ports[p][1] for p in port_names], mode="markers+text", name="inputs",
        showlegend=False, customdata=port_names, hovertemplate="%{customdata}<extra></extra>",
        text=[p.rsplit(".", 1)[-1] if p.startswith("a") else "" for p in port_names], textposition="bottom center",
        textfont=dict(size=9, color="#555555"), marker=dict(size=5, color="#777777"), meta=dict(kind="ports")))
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
    parts.append("edges: blue score > 0, red < 0 (the clean value supports the answer), width |score|")
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


SIGN_TEXT = ("How to read an edge: its score estimates how much the metric changes when that edge alone carries "
             "its sender's corrupted value while everything else stays clean. Negative (red): the edge's clean "
             "value supports the answer, and corrupting it lowers the metric; positive (blue): the edge works "
             "against the answer. Width grows with |score|; q, k and v label each head's query, key and value "
             "inputs.")

BODY = """<p class="caption" id="caption">{caption}</p>
<p class="sign" id="sign">{sign}</p>
{graph}
{curve}
{table}
"""

TABLE_STYLE = """<style>
table.edges {{ border-collapse: collapse; font-size: 0.9em; margin-top: 1em; }}
table.edges th, table.edges td {{ padding: 0.15em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }}
table.edges th {{ cursor: pointer; background: #f2f2f2; user-select: none; }}
table.edges td.num {{ text-align: right; font-family: monospace; }}
</style>"""

TABLE_SCRIPT = """<script type="text/javascript">
(function () {
  var table = document.getElementById("edges"), body = table.tBodies[0];
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, column) {
    th.addEventListener("click", function () {
      var up = th.getAttribute("data-order") !== "ascending";
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (c) { c.removeAttribute("data-order"); });
      th.setAttribute("data-order", up ? "ascending" : "descending");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column].getAttribute("data-value"), y = b.cells[column].getAttribute("data-value");
        var nx = Number(x), ny = Number(y);
        var order = (isNaN(nx) || isNaN(ny)) ? (x < y ? -1 : x > y ? 1 : 0) : nx - ny;
        return up ? order : -order;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
})();
</script>"""


def table_edges(graph, max_table: int) -> tuple:
    """(rows of the edge table, n scored edges): (sender, receiver, score, in_circuit), the circuit's first,
    then by |score|, at most ``max_table``."""
    edges, _, _ = drawn_edges(graph, max_table)
    scores = graph.scores.detach().to("cpu", torch.float64)
    n_scored = int((edge_mask_for(list(graph.senders), list(graph.receivers)) & ~torch.isnan(scores)).sum())
    return edges, n_scored


def table_html(graph, max_table: int = 1000) -> str:
    """A table (id ``edges``) of the graph's scored edges, the circuit's first, then by |score|, at most
    ``max_table``: sender, receiver, score, |score|, in the circuit; a click on a heading sorts by it."""
    rows, n_scored = table_edges(graph, max_table)
    circuit = graph.in_circuit is not None
    body = "\n".join(
        f'<tr><td data-value="{html.escape(s)}">{html.escape(s)}</td>'
        f'<td data-value="{html.escape(r)}">{html.escape(r)}</td>'
        f'<td class="num" data-value="{score!r}">{score:+.4g}</td>'
        f'<td class="num" data-value="{abs(score)!r}">{abs(score):.4g}</td>'
        f'<td data-value="{int(inside)}">{("yes" if inside else "no") if circuit else "-"}</td></tr>'
        for s, r, score, inside in rows)
    shown = (f"{len(rows):,} of {n_scored:,} scored edges" + (", the circuit's first, then" if circuit else ",")
             + " by |score|; click a heading to sort")
    return (TABLE_STYLE.format() + f'<h2>edges</h2>\n<p class="caption" id="table-caption">{shown}</p>\n'
            '<table class="edges" id="edges"><thead><tr><th>sender</th><th>receiver</th><th>score</th>'
            f'<th>|score|</th><th>in circuit</th></tr></thead>\n<tbody>\n{body}\n</tbody></table>\n' + TABLE_SCRIPT)


def circuit_page(graph, path: Optional[Union[str, Path]] = None, title: str = "circuit", max_edges: int = 200,
                 faithfulness: Optional[float] = None, curve: Optional[Union[Mapping, Sequence]] = None,
                 max_table: int = 1000) -> str:
    """The offline page of ``graph``: a caption (method, metric, model, edges shown, ``faithfulness``
    when given), the sign convention (id ``sign``), the graph figure (div id ``circuit``), when ``curve``
    is given faithfulness against circuit size (div id ``faithfulness``), and the sortable edge table
    (``table_html``, at most ``max_table`` rows). plotly.js is inlined; nothing is fetched.
    Writes the page to ``path`` when given; returns it."""
    if faithfulness is not None and not math.isfinite(float(faithfulness)):
        raise ValueError(f"faithfulness must be a finite number, got {faithfulness!r}")
    if not isinstance(max_table, int) or isinstance(max_table, bool) or max_table < 1:
        raise ValueError(f"max_table must be a whole number >= 1, got {max_table!r}")
    edges, n_edges, n_circuit = drawn_edges(graph, max_edges)
    text = caption(graph, len(edges), n_edges, n_circuit, faithfulness)
    fig = circuit_plot(graph, max_edges=max_edges, title="")  # the page's <h1> holds the title
    parts = dict(graph=fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, div_id="circuit"),
                 curve="" if curve is None else curve_plot(curve).to_html(
                     full_html=False, include_plotlyjs=False, include_mathjax=False, div_id="faithfulness"))
    page = html_page(title, BODY.format(caption=html.escape(text), sign=html.escape(SIGN_TEXT),
                                        table=table_html(graph, max_table), **parts))
    if path is not None:
        write_text(path, page)  # written whole (glassbox.fs)
    return page
