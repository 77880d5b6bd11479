"""The circuit graph figure and its offline page (glassbox.interp.plots.graph).

Graphs are built here by hand: a few edges with chosen scores (every other edge NaN, so unscored and
not drawn), which fixes by hand which edges the figure must draw, in what colour and in what order
of width. The page is opened in headless Chromium (the viewer test's harness: every host name
resolves to nothing, errors and resource loads are recorded); a probe reads plotly's own data back
from the rendered graph div, hovers one edge's midpoint and reports what it saw.
"""

import math

import pytest
import torch

from glassbox.interp.attribution.edges import edge_exists, edge_mask_for, receivers, senders
from glassbox.interp.attribution.graph import Graph
from glassbox.interp.plots.graph import (NEGATIVE, OUTSIDE, POSITIVE, circuit_page, circuit_plot, drawn_edges,
                                         layout_positions)
from glassbox.models import Config
from test_viewer_browser import CAPTURE, LAYOUT, find_browser, overflowing, probe, run_in_browser, screenshot

CFG = Config(d_model=35, n_layers=3, n_heads=5, d_vocab=29, n_ctx=17)  # distinct sizes
GQA = Config(d_model=48, n_layers=2, n_heads=6, n_key_value_heads=2, d_vocab=29, n_ctx=17)

# Chosen edges: (sender, receiver) -> score. Every other edge is NaN (left unscored).
CHOSEN = {("input", "a0.h1.q"): 0.5, ("a0.h2", "a1.h0.k"): 3.0, ("a0.h2", "a2.h4.v"): -2.0,
          ("m0", "logits"): 1.5, ("a1.h3", "m1"): -0.25, ("input", "logits"): 0.75, ("m1", "a2.h0.q"): -4.0}
CIRCUIT = {("a0.h2", "a1.h0.k"), ("a1.h3", "m1")}  # one strong and one weak edge


def hand_graph(cfg=CFG, chosen=CHOSEN, circuit=None, metadata=None) -> Graph:
    names_s, names_r = senders(cfg), receivers(cfg)
    scores = torch.full((len(names_s), len(names_r)), float("nan"))
    for (s, r), value in chosen.items():
        assert edge_exists(s, r), (s, r)
        scores[names_s.index(s), names_r.index(r)] = value
    mask = None
    if circuit is not None:
        mask = torch.zeros(scores.shape, dtype=torch.bool)
        for s, r in circuit:
            mask[names_s.index(s), names_r.index(r)] = True
    return Graph(names_s, names_r, scores, metadata or {"method": "EAP-IG", "steps": 7, "metric": "logit_diff"}, mask)


def edge_traces(fig) -> list:
    return [t for t in fig.data if (t.meta or {}).get("kind") == "edge"]


# --- layout --------------------------------------------------------------------------------------

def test_layout_rows_bottom_to_top_and_ports_below_their_heads():
    nodes, ports = layout_positions(senders(CFG), receivers(CFG))
    assert set(nodes) == {"input", "logits"} | {f"a{L}.h{H}" for L in range(3) for H in range(5)} | {"m0", "m1", "m2"}
    assert set(ports) == set(receivers(CFG))
    y = {n: p[1] for n, p in nodes.items()}
    assert y["input"] == 0 and y["logits"] == 7  # rows: input, a0, m0, a1, m1, a2, m2, logits
    for L in range(3):
        assert {y[f"a{L}.h{H}"] for H in range(5)} == {2 * L + 1} and y[f"m{L}"] == 2 * L + 2
    # heads left to right, centred on x = 0; the MLPs, input and logits at 0
    assert [nodes[f"a1.h{H}"][0] for H in range(5)] == [-2, -1, 0, 1, 2]
    assert nodes["m1"][0] == 0 and nodes["input"][0] == 0 and nodes["logits"][0] == 0
    for L in range(3):
        for H in range(5):
            hx, hy = nodes[f"a{L}.h{H}"]
            q, k, v = (ports[f"a{L}.h{H}.{p}"] for p in "qkv")
            assert q[1] == k[1] == v[1] and hy - 0.5 < q[1] < hy, "ports just below their head"
            assert q[0] < k[0] == hx < v[0] and v[0] - q[0] < 1, "q, k, v left to right, closer than a head apart"
        assert nodes[f"m{L}"][1] - 0.5 < ports[f"m{L}"][1] < nodes[f"m{L}"][1]
    assert nodes["logits"][1] - 0.5 < ports["logits"][1] < nodes["logits"][1]


def test_layout_grouped_query_ports_sit_under_the_heads_that_share_them():
    nodes, ports = layout_positions(senders(GQA), receivers(GQA))
    assert {"a0.kv0", "a0.kv1", "a1.kv0", "a1.kv1"} <= set(nodes) and "a0.h0.k" not in ports
    for L in range(2):
        for G in range(2):
            heads = [nodes[f"a{L}.h{H}"][0] for H in range(3 * G, 3 * G + 3)]  # 6 heads / 2 kv heads
            kx, ky = ports[f"a{L}.kv{G}.k"]
            vx, vy = ports[f"a{L}.kv{G}.v"]
            assert abs((kx + vx) / 2 - sum(heads) / 3) < 1e-12 and kx < vx and ky == vy < nodes[f"a{L}.h0"][1]
    fig = circuit_plot(hand_graph(GQA, {("a0.h1", "a1.kv1.k"): 1.0, ("input", "a1.kv0.v"): -1.0}))
    assert {(t.meta["sender"], t.meta["receiver"]) for t in edge_traces(fig)} == {("a0.h1", "a1.kv1.k"),
                                                                                  ("input", "a1.kv0.v")}


def every_edge_graph(cfg, seed=3) -> Graph:
    names_s, names_r = senders(cfg), receivers(cfg)
    scores = torch.randn(len(names_s), len(names_r), generator=torch.Generator().manual_seed(seed))
    return Graph(names_s, names_r, scores.masked_fill(~edge_mask_for(names_s, names_r), float("nan")), {"method": "EAP"})


def blocking(fig) -> list:
    """(edge, node or port, where) for each piece of an edge's path that passes a node or port that the edge
    does not touch: a slanted piece with any node or port within its height, or a vertical piece within 0.15
    head places of one within its height (head places are ~100 px apart on a 1400 px page: 15 px, more than
    a node's radius, 8 px, plus half the widest line, 4.5 px)."""
    nodes = next(t for t in fig.data if (t.meta or {}).get("kind") == "nodes")
    ports = next(t for t in fig.data if (t.meta or {}).get("kind") == "ports")
    points = list(zip(nodes.customdata, nodes.x, nodes.y)) + list(zip(ports.customdata, ports.x, ports.y))
    bad = []
    for t in edge_traces(fig):
        own = {t.meta["sender"], t.meta["receiver"], t.meta["receiver"].rsplit(".", 1)[0]}
        for i in range(len(t.x) - 1):
            (x0, y0), (x1, y1) = (t.x[i], t.y[i]), (t.x[i + 1], t.y[i + 1])
            low, high = min(y0, y1), max(y0, y1)
            for name, x, y in points:
                if name in own or not low <= y <= high:
                    continue
                if x0 != x1 or abs(x - x0) < 0.15:
                    bad.append((t.name, name, ((x0, y0), (x1, y1))))
    return bad


@pytest.mark.parametrize("cfg", [CFG, GQA], ids=["MHA", "GQA"])
def test_no_edge_passes_through_a_node_it_does_not_touch(cfg):
    """Every edge of a graph (all drawn), routed: the straight lines of before ran input -> m0 through a0.h2."""
    fig = circuit_plot(every_edge_graph(cfg), max_edges=100_000)
    assert len(edge_traces(fig)) == int(edge_mask_for(senders(cfg), receivers(cfg)).sum())
    assert blocking(fig) == [], blocking(fig)[:5]


def test_the_strongest_edge_of_the_shipped_models_circuit_reads_as_itself():
    """The shipped model's 2 layers x 3 heads: input -> m0 passes beside the heads, not through a0.h1."""
    cfg = Config(d_model=192, n_layers=2, n_heads=3, d_vocab=29, n_ctx=17)
    fig = circuit_plot(hand_graph(cfg, {("input", "m0"): -8.7, ("m0", "a1.h0.v"): -7.4, ("a1.h0", "logits"): -5.8,
                                        ("input", "logits"): 0.3, ("a0.h2", "m1"): 0.2}))
    assert blocking(fig) == [], blocking(fig)
    line = next(t for t in edge_traces(fig) if t.name == "input -> m0")
    assert len(line.x) == 6 and abs(line.x[2]) == 0.5, (line.x, line.y)  # through the gap beside a0.h1


# --- which edges, how drawn ----------------------------------------------------------------------

def test_drawn_edges_are_the_strongest_and_unscored_edges_are_left_out():
    edges, n_edges, n_circuit = drawn_edges(hand_graph(), max_edges=4)
    assert n_edges == int(edge_mask_for(senders(CFG), receivers(CFG)).sum()) and n_circuit == 0
    assert [(s, r, score) for s, r, score, _ in edges] == [
        ("m1", "a2.h0.q", -4.0), ("a0.h2", "a1.h0.k", 3.0), ("a0.h2", "a2.h4.v", -2.0), ("m0", "logits", 1.5)]
    edges, _, _ = drawn_edges(hand_graph(), max_edges=100)
    assert len(edges) == len(CHOSEN)  # the NaN edges are never drawn


def test_circuit_edges_come_first_then_the_strongest_outside():
    edges, _, n_circuit = drawn_edges(hand_graph(circuit=CIRCUIT), max_edges=4)
    assert n_circuit == 2
    assert [(s, r, inside) for s, r, _, inside in edges] == [
        ("a0.h2", "a1.h0.k", True), ("a1.h3", "m1", True),  # the weak circuit edge beats stronger outsiders
        ("m1", "a2.h0.q", False), ("a0.h2", "a2.h4.v", False)]
    edges, _, _ = drawn_edges(hand_graph(circuit=CIRCUIT), max_edges=1)
    assert [(s, r) for s, r, _, _ in edges] == [("a0.h2", "a1.h0.k")]


def test_random_graph_draws_its_top_edges_by_absolute_score():
    names_s, names_r = senders(CFG), receivers(CFG)
    scores = torch.randn(len(names_s), len(names_r), generator=torch.Generator().manual_seed(3))
    scores = scores.masked_fill(~edge_mask_for(names_s, names_r), float("nan"))
    graph = Graph(names_s, names_r, scores, {"method": "EAP"})
    by_hand = sorted(((abs(float(scores[i, j])), s, r) for i, s in enumerate(names_s) for j, r in enumerate(names_r)
                      if edge_exists(s, r)), reverse=True)[:37]
    drawn = {(t.meta["sender"], t.meta["receiver"]) for t in edge_traces(circuit_plot(graph, max_edges=37))}
    assert drawn == {(s, r) for _, s, r in by_hand}


def test_width_follows_absolute_score_and_colour_follows_sign():
    fig = circuit_plot(hand_graph())
    traces = edge_traces(fig)
    assert len(traces) == len(CHOSEN)
    for t in traces:
        assert t.meta["score"] == CHOSEN[(t.meta["sender"], t.meta["receiver"])]
        assert t.line.color == (POSITIVE if t.meta["score"] > 0 else NEGATIVE)
        assert t.name == f"{t.meta['sender']} -> {t.meta['receiver']}"
    by_score = sorted(traces, key=lambda t: abs(t.meta["score"]))
    widths = [t.line.width for t in by_score]
    assert widths == sorted(widths) and len(set(widths)) == len(widths), "wider for a larger |score|"
    assert by_score[-1].meta["receiver"] == "a2.h0.q" and widths[-1] > 10 * widths[0] / 2
    # drawn weakest first, so the strongest lie on top
    assert [abs(t.meta["score"]) for t in traces] == sorted(abs(t.meta["score"]) for t in traces)
    nodes, ports = layout_positions(senders(CFG), receivers(CFG))
    for t in traces:
        assert (t.x[0], t.y[0]) == nodes[t.meta["sender"]] and (t.x[-1], t.y[-1]) == ports[t.meta["receiver"]]


def test_outside_the_circuit_is_grey_and_circuit_nodes_are_dark():
    fig = circuit_plot(hand_graph(circuit=CIRCUIT))
    for t in edge_traces(fig):
        inside = (t.meta["sender"], t.meta["receiver"]) in CIRCUIT
        assert t.meta["in_circuit"] == inside
        assert (t.line.color == OUTSIDE) == (not inside), t.name
    # grey ones below (earlier) than every circuit edge
    flags = [t.meta["in_circuit"] for t in edge_traces(fig)]
    assert flags == sorted(flags)
    node_trace = next(t for t in fig.data if (t.meta or {}).get("kind") == "nodes")
    dark = {n for n, c in zip(node_trace.customdata, node_trace.marker.color) if c != "#dddddd"}
    assert dark == {"a0.h2", "a1.h0", "a1.h3", "m1"}


def test_hover_trace_names_each_drawn_edge_with_its_score():
    fig = circuit_plot(hand_graph(), max_edges=3)
    hover = next(t for t in fig.data if (t.meta or {}).get("kind") == "edge_hover")
    assert [tuple(c) for c in hover.customdata] == [("m1", "a2.h0.q", -4.0), ("a0.h2", "a1.h0.k", 3.0),
                                                    ("a0.h2", "a2.h4.v", -2.0)]
    line = next(t for t in edge_traces(fig) if t.name == "m1 -> a2.h0.q")
    # half-way along the drawn path, by its length (computed here from the trace's own points)
    pieces = [math.hypot(line.x[i + 1] - line.x[i], line.y[i + 1] - line.y[i]) for i in range(len(line.x) - 1)]
    walked, half = 0.0, sum(pieces) / 2
    for i, piece in enumerate(pieces):
        if walked + piece >= half:
            t = (half - walked) / piece
            expected = (line.x[i] + t * (line.x[i + 1] - line.x[i]), line.y[i] + t * (line.y[i + 1] - line.y[i]))
            break
        walked += piece
    assert math.isclose(hover.x[0], expected[0], abs_tol=1e-12) and math.isclose(hover.y[0], expected[1], abs_tol=1e-12)


def test_caption_and_refusals(tmp_path):
    page = circuit_page(hand_graph(circuit=CIRCUIT), tmp_path / "sub" / "c.html", title="<b>t</b>", max_edges=5,
                        faithfulness=0.9375)
    assert (tmp_path / "sub" / "c.html").read_text(encoding="utf-8") == page
    caption = page.split('<p class="caption" id="caption">', 1)[1].split("</p>", 1)[0]
    for part in ("EAP-IG (7 steps)", "metric logit_diff", f"5 of {hand_graph().n_edges:,} edges shown",
                 "2 in the circuit", "faithfulness 0.938"):
        assert part in caption, (part, caption)
    assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in page and "<script src" not in page
    eap = circuit_page(hand_graph(metadata={"method": "EAP", "metric": "m"}))
    assert "steps" not in eap.split('id="caption">', 1)[1].split("</p>", 1)[0]
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="max_edges"):
            circuit_plot(hand_graph(), max_edges=bad)
    with pytest.raises(ValueError, match=r"a0\.h2 -> a1\.h0\.k has score inf"):
        circuit_plot(hand_graph(chosen={**CHOSEN, ("a0.h2", "a1.h0.k"): math.inf}))
    with pytest.raises(ValueError, match="faithfulness"):
        circuit_page(hand_graph(), faithfulness=float("nan"))


# --- in a browser --------------------------------------------------------------------------------

PROBE = probe("""  try {
    var gd = document.getElementById("circuit");
    out.edges = gd.data.filter(function (t) { return t.meta && t.meta.kind === "edge"; }).map(function (t) {
      return [t.meta.sender, t.meta.receiver, t.meta.score, t.meta.in_circuit, t.line.width, t.line.color]; });
    out.n_traces = gd.data.length;
    out.rendered_traces = gd.querySelectorAll(".scatterlayer .trace").length;
    out.rendered_lines = gd.querySelectorAll(".scatterlayer .trace .js-line").length;
    var hoverIndex = gd.data.findIndex(function (t) { return t.meta && t.meta.kind === "edge_hover"; });
    Plotly.Fx.hover(gd, [{curveNumber: hoverIndex, pointNumber: 0}]);
    out.hover = Array.prototype.map.call(gd.querySelectorAll(".hoverlayer .hovertext"),
                                         function (n) { return n.textContent; });
    out.caption = document.getElementById("caption").textContent;
    var curve = document.getElementById("faithfulness");
    out.curve = curve.data[0].y;
    out.curve_rendered = curve.querySelector(".main-svg") !== null;
    out.sign = document.getElementById("sign").textContent;
    var table = document.getElementById("edges");
    var column = function (i) { return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
      return r.cells[i].textContent; }); };
    out.table_first = [column(0), column(1), column(2), column(4)];
    table.tHead.rows[0].cells[2].click();
    out.table_score_up = column(2);
    table.tHead.rows[0].cells[2].click();
    out.table_score_down = column(2);
    table.tHead.rows[0].cells[0].click();
    out.table_sender_up = column(0);
    out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  } catch (e) { out.exception = String(e && e.stack || e); }
""")


def test_page_in_headless_chromium(tmp_path):
    browser = find_browser()
    graph = hand_graph(circuit=CIRCUIT)
    page = circuit_page(graph, max_edges=5, faithfulness=0.91, curve={2: 0.4, 5: 0.91, 40: 1.0})
    path = tmp_path / "probe.html"
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", PROBE + "</body>", 1),
                    encoding="utf-8")
    seen, stderr = run_in_browser(browser, str(path))
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert not [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    assert [r for r in seen["resources"] if not r.startswith("file:")] == [], "the page fetched something"
    # The two circuit edges and the three strongest outside it, as chosen by hand above.
    drawn = {(s, r): (score, inside, colour) for s, r, score, inside, _, colour in seen["edges"]}
    assert drawn == {("a0.h2", "a1.h0.k"): (3.0, True, POSITIVE), ("a1.h3", "m1"): (-0.25, True, NEGATIVE),
                     ("m1", "a2.h0.q"): (-4.0, False, OUTSIDE), ("a0.h2", "a2.h4.v"): (-2.0, False, OUTSIDE),
                     ("m0", "logits"): (1.5, False, OUTSIDE)}
    widths = {(s, r): w for s, r, _, _, w, _ in seen["edges"]}
    assert widths[("m1", "a2.h0.q")] > widths[("a0.h2", "a1.h0.k")] > widths[("m0", "logits")] > widths[("a1.h3", "m1")]
    assert seen["rendered_traces"] == seen["n_traces"] == 5 + 3  # edges, hover markers, nodes, ports
    assert seen["rendered_lines"] == 5, "every edge drawn as a line"
    assert len(seen["hover"]) == 1 and "a0.h2 -> a1.h0.k" in seen["hover"][0] and "score 3" in seen["hover"][0], \
        seen["hover"]
    assert "5 of" in seen["caption"] and "faithfulness 0.910" in seen["caption"] and "EAP-IG" in seen["caption"]
    assert seen["curve"] == [0.4, 0.91, 1.0] and seen["curve_rendered"]
    assert "Negative (red): the edge's clean value supports the answer" in seen["sign"], seen["sign"]
    # The table: every scored edge, the circuit's first, then by |score|; sortable by any column.
    senders_, receivers_, scores_, inside_ = seen["table_first"]
    assert list(zip(senders_, receivers_)) == [("a0.h2", "a1.h0.k"), ("a1.h3", "m1"), ("m1", "a2.h0.q"),
                                               ("a0.h2", "a2.h4.v"), ("m0", "logits"), ("input", "logits"),
                                               ("input", "a0.h1.q")]
    assert [float(v) for v in scores_] == [CHOSEN[e] for e in zip(senders_, receivers_)]
    assert inside_ == ["yes", "yes", "no", "no", "no", "no", "no"]
    assert [float(v) for v in seen["table_score_up"]] == sorted(CHOSEN.values())
    assert [float(v) for v in seen["table_score_down"]] == sorted(CHOSEN.values(), reverse=True)
    assert seen["table_sender_up"] == sorted(s for s, _ in CHOSEN)


PIXELS = probe(LAYOUT + """  try {
    var gd = document.getElementById("circuit");
    var xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
    var px = function (x, y) { return [xa._offset + xa.l2p(x), ya._offset + ya.l2p(y)]; };
    var nodes = gd.data.filter(function (t) { return t.meta && t.meta.kind === "nodes"; })[0];
    var near = [];
    gd.data.filter(function (t) { return t.meta && t.meta.kind === "edge"; }).forEach(function (t) {
      var own = [t.meta.sender, t.meta.receiver.replace(/\\.[qkv]$/, "")];
      nodes.customdata.forEach(function (name, i) {
        if (own.indexOf(name) >= 0) { return; }
        var c = px(nodes.x[i], nodes.y[i]), best = Infinity;
        for (var j = 0; j + 1 < t.x.length; j++) {
          var a = px(t.x[j], t.y[j]), b = px(t.x[j + 1], t.y[j + 1]);
          var dx = b[0] - a[0], dy = b[1] - a[1], len = dx * dx + dy * dy;
          var u = len ? Math.max(0, Math.min(1, ((c[0] - a[0]) * dx + (c[1] - a[1]) * dy) / len)) : 0;
          best = Math.min(best, Math.hypot(a[0] + u * dx - c[0], a[1] + u * dy - c[1]));
        }
        near.push([t.name, name, best, t.line.width]);
      });
    });
    out.near = near;
    out.port_labels = Array.prototype.map.call(gd.querySelectorAll(".scatterlayer .trace:last-child .textpoint"),
                                               function (n) { return n.textContent; });
  } catch (e) { out.exception = String(e && e.stack || e); }
  out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
""", delay_ms=1000)


SHIPPED_LIKE = {("input", "m0"): -8.7, ("m0", "a1.h0.v"): -7.4, ("a1.h0", "logits"): -5.8, ("m0", "a1.h0.k"): 4.4,
                ("m0", "a1.h2.v"): -2.5, ("a1.h2", "logits"): -1.7, ("m1", "logits"): -1.3, ("a1.h2", "m1"): -0.76,
                ("input", "a0.h1.v"): -0.57, ("a0.h1", "m0"): -0.51, ("input", "logits"): 0.3, ("a0.h2", "m1"): 0.2,
                ("input", "a1.h1.q"): 0.4, ("a0.h0", "a1.h2.k"): -0.3}


@pytest.mark.parametrize("width", [800, 1400])
def test_no_edge_passes_within_a_nodes_radius_in_chromium(tmp_path, width):
    """The shipped model's shape (2 layers x 3 heads) and its strongest edges, drawn: in pixels, every edge
    keeps clear of every node it does not touch by more than the node's radius (8 px) plus half its own
    width. Before, input -> m0 ran through a0.h1 (0 px), reading as input -> a0.h1 -> m0."""
    browser = find_browser()
    cfg = Config(d_model=192, n_layers=2, n_heads=3, d_vocab=29, n_ctx=17)
    page = circuit_page(hand_graph(cfg, SHIPPED_LIKE, circuit={("input", "m0"), ("m0", "a1.h0.v")}))
    path = tmp_path / "probe.html"
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", PIXELS + "</body>", 1),
                    encoding="utf-8")
    seen, _ = run_in_browser(browser, str(path), window=(width, 900))
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [] and [r for r in seen["resources"] if not r.startswith("file:")] == []
    assert len(seen["near"]) == len(SHIPPED_LIKE) * (len(senders(cfg)) + 1 - 2)
    crowded = [(e, n, round(d, 1)) for e, n, d, w in seen["near"] if d <= 8 + w / 2]
    assert crowded == [], crowded
    assert overflowing(seen) == [], overflowing(seen)
    assert sorted(set(seen["port_labels"]) - {""}) == ["k", "q", "v"], seen["port_labels"]


def test_circuit_page_screenshot(tmp_path):
    """At 1400 px, what a reader sees: the red edges (negative scores: the clean value supports the answer)
    and the blue ones drawn, the q/k/v port labels and the edge table on the first screen."""
    browser = find_browser()
    cfg = Config(d_model=192, n_layers=2, n_heads=3, d_vocab=29, n_ctx=17)
    path = tmp_path / "c.html"
    circuit_page(hand_graph(cfg, SHIPPED_LIKE), path)
    width, height, rows = screenshot(browser, str(path), str(tmp_path / "c.png"), (1400, 900))
    assert (width, height) == (1400, 900)
    red = sum(1 for row in rows for p in row if p[0] > 150 and p[1] < 90 and p[2] < 100)
    blue = sum(1 for row in rows for p in row if p[2] > 140 and p[0] < 110 and p[1] < 150)
    assert red > 800 and blue > 100, (red, blue)  # measured 1589 and 500-odd
    table_header = sum(1 for row in rows[600:] for p in row if p == (0xf2, 0xf2, 0xf2))
    assert table_header > 1000, table_header  # the table's grey heading row is on the first screen
