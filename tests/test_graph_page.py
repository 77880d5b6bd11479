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
from test_viewer_browser import CAPTURE, find_browser, probe, run_in_browser

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
    # heads left to right, centred on x = 0; the MLP right of the last head; input and logits at 0
    assert [nodes[f"a1.h{H}"][0] for H in range(5)] == [-2, -1, 0, 1, 2]
    assert nodes["m1"][0] > 2 and nodes["input"][0] == 0 and nodes["logits"][0] == 0
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
        assert (t.x[0], t.y[0]) == nodes[t.meta["sender"]] and (t.x[1], t.y[1]) == ports[t.meta["receiver"]]


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
    nodes, ports = layout_positions(senders(CFG), receivers(CFG))
    assert hover.x[0] == (nodes["m1"][0] + ports["a2.h0.q"][0]) / 2
    assert hover.y[0] == (nodes["m1"][1] + ports["a2.h0.q"][1]) / 2


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
