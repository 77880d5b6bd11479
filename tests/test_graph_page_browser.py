"""The attribution-graph page in headless Chromium (the harness of test_viewer_browser.py): it draws every
node and link, places logits above features above tokens, a click shows the node, pinning and "show pinned"
leave only the pinned node, a clicked feature shows its top-activating contexts and logit effects (equal to
the embedded data, which equals a hand computation here), grouping two nodes draws one box whose edges are
the sums of the members' edges in the adjacency, ungroup restores them, no node leaves the window at 800
and 1400 px, and it loads nothing and raises nothing."""

import json

import torch

from glassbox.interp.graphs import attribute
from glassbox.interp.graphs.details import feature_details
from glassbox.interp.graphs.export import frontend_json
from glassbox.interp.graphs.page import graph_page
from glassbox.interp.graphs.prune import prune_graph
from tests.graph_models import family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens
from tests.test_viewer_browser import CAPTURE, find_browser, probe, run_in_browser, screenshot

PROBE = probe("""  try {
    var circles = document.querySelectorAll("circle");
    out.circles = circles.length;
    out.lines = document.querySelectorAll("line").length;
    var y = {};
    document.querySelectorAll("circle").forEach(function (c) {
      var n = D.nodes.find(function (d) { return d.node_id === c.getAttribute("data-id"); });
      (y[n.feature_type] = y[n.feature_type] || []).push(+c.getAttribute("cy"));
    });
    out.y = y;
    var click = function (id, shift) {
      document.querySelector('[data-id="' + id + '"]').dispatchEvent(new MouseEvent("click", {shiftKey: !!shift}));
    };
    click(D.nodes.find(function (d) { return d.feature_type === "logit"; }).node_id);
    out.info = document.getElementById("info").textContent;
    document.getElementById("pin").click();
    document.getElementById("only").click();
    out.after_pin = document.querySelectorAll("circle").length;
    out.pinned_class = document.querySelectorAll("circle.pinned").length;
    document.getElementById("all").click();
    out.after_all = document.querySelectorAll("circle").length;
    click(FEATURE);
    out.contexts = Array.prototype.map.call(document.querySelectorAll("#details .ctx"), function (c) {
      return {row: +c.dataset.row, pos: +c.dataset.pos, act: +c.dataset.act,
              acts: Array.prototype.map.call(c.querySelectorAll(".tok"), function (t) { return +t.dataset.act; }),
              text: Array.prototype.map.call(c.querySelectorAll(".tok"), function (t) { return t.textContent; }),
              top: Array.prototype.map.call(c.querySelectorAll(".tok"), function (t) { return t.classList.contains("top"); })};
    });
    var logits = function (cls) { return Array.prototype.map.call(document.querySelectorAll("#details ul." + cls + " li"),
      function (li) { return [li.dataset.token, +li.dataset.value]; }); };
    out.up = logits("up"); out.down = logits("down");
    out.details_text = document.getElementById("details").textContent;
    GROUP.forEach(function (id) { click(id, true); });
    out.chosen = document.querySelectorAll("circle.chosen").length;
    document.getElementById("label").value = "my <group>";
    document.getElementById("group").click();
    out.rects = document.querySelectorAll("rect.super").length;
    out.after_group = document.querySelectorAll("circle").length;
    out.group_label = Array.prototype.map.call(document.querySelectorAll("text"), function (t) { return t.textContent; })
      .filter(function (t) { return t === "my <group>"; }).length;
    out.super_edges = Array.prototype.filter.call(document.querySelectorAll("line"), function (l) {
      return l.dataset.source === "super_0" || l.dataset.target === "super_0"; }).map(function (l) {
      return [l.dataset.source, l.dataset.target, +l.dataset.weight]; });
    click("super_0");
    out.super_info = document.getElementById("info").textContent;
    document.getElementById("ungroup").click();
    out.after_ungroup = [document.querySelectorAll("circle").length, document.querySelectorAll("rect.super").length,
                         document.querySelectorAll("line").length];
    out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  } catch (e) { out.exception = String(e && e.stack || e); }
""")

BOUNDS = probe("""  var pane = document.getElementById("pane").getBoundingClientRect();
  var g = document.getElementById("g").getBoundingClientRect();
  out.pane = [pane.left, pane.right, g.top, g.bottom];
  out.nodes = Array.prototype.map.call(document.querySelectorAll("circle, rect.super"), function (c) {
    var r = c.getBoundingClientRect(); return [c.getAttribute("data-id"), r.left, r.right, r.top, r.bottom]; });
  out.page = [document.documentElement.scrollWidth, window.innerWidth];
""")


def build(tmp_path):
    model, _ = family_model("gpt2")
    ts = family_transcoders("gpt2")
    graph = attribute(model, ts, prompt_tokens("induction", 3, 53))
    pruned = prune_graph(graph, 0.8, 0.98)
    toks = [f"<t{i}>" for i in range(graph.n_pos)]  # markup in token text must stay text
    data = frontend_json(graph, pruned, slug="g", prompt="</script><b>p</b>", token_strings=toks,
                         logit_strings=[f"l{i}" for i in range(graph.n_logits)])
    text = torch.randint(0, 53, (6, 37), generator=torch.Generator().manual_seed(5))
    details = feature_details(model, ts, data, text, n_contexts=4, n_logits=5)
    return model, ts, graph, pruned, data, text, details


def node_index(graph, node_id: str) -> int:
    """The adjacency index of a page node id, from the node order graph.py documents."""
    kind, *rest = node_id.split("_")
    if kind == "err":
        layer, pos = map(int, rest)
        return graph.error_start + layer * graph.n_pos + pos
    if kind == "E":
        return graph.token_start + int(rest[1])
    if int(kind) == graph.n_layers + 1:
        return graph.logit_start + graph.logit_tokens.tolist().index(int(rest[0]))
    layer, feature, pos = int(kind), int(rest[0]), int(rest[1])
    return graph.active_features.tolist().index([layer, pos, feature])


def test_graph_page_in_headless_chromium(tmp_path):
    browser = find_browser()
    model, ts, graph, pruned, data, text, details = build(tmp_path)
    features = [n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"]
    feature = max(features, key=lambda n: len(details[n["node_id"].rsplit("_", 1)[0]]["contexts"]))
    group = [n["node_id"] for n in features[:2]]
    shown_details = json.loads(json.dumps(details))  # the page's copy, with markup in one token's text
    hostile = "</script><b>x</b>\n&amp;"
    shown_details[feature["node_id"].rsplit("_", 1)[0]]["contexts"][0]["tokens"][0] = hostile
    page = graph_page(data, graph.n_layers, details=shown_details, details_text="6 random windows")
    path = tmp_path / "probe.html"
    setup = f"<script>var FEATURE = {json.dumps(feature['node_id'])}, GROUP = {json.dumps(group)};</script>"
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", setup + PROBE + "</body>", 1))
    seen, stderr = run_in_browser(browser, str(path))
    assert "exception" not in seen, seen.get("exception")
    assert seen["errors"] == [] and seen["resources"] == []
    assert seen["circles"] == len(data["nodes"]) > 5
    assert seen["lines"] == len(data["links"]) > 5
    y = seen["y"]
    assert max(y["logit"]) < min(y["cross layer transcoder"]) and max(y["cross layer transcoder"]) < min(y["embedding"])
    assert seen["info"].startswith("Output") and "strongest inputs" in seen["info"]
    assert seen["after_pin"] == 1 and seen["pinned_class"] == 1 and seen["after_all"] == seen["circles"]

    # the clicked feature's contexts and logits are the embedded ones ...
    layer, f, _ = map(int, feature["node_id"].split("_"))
    record = details[f"{layer}_{f}"]
    assert len(seen["contexts"]) == len(record["contexts"]) >= 2
    page_record = shown_details[f"{layer}_{f}"]
    for shown, c, p in zip(seen["contexts"], record["contexts"], page_record["contexts"]):
        assert (shown["row"], shown["pos"]) == (c["row"], c["pos"]) and shown["act"] == c["act"]
        assert shown["acts"] == c["acts"] and shown["top"].index(True) == c["pos"] - c["start"]
        assert shown["text"] == [t.replace("\n", "\u21b5") for t in p["tokens"]]
    assert seen["contexts"][0]["text"][0] == "</script><b>x</b>\u21b5&amp;"  # markup stays text
    assert seen["up"] == record["top_logits"] and seen["down"] == record["bottom_logits"]
    assert f"of its decoder row into layer {layer}" in seen["details_text"] and "(6 random windows)" in seen["details_text"]
    # ... and the embedded ones are a hand computation: relu(x W_enc + b_enc) at the input hook,
    _, cache = model.run_with_cache(text, names_filter=[ts.feature_input_hook(layer)])
    x = cache[ts.feature_input_hook(layer)].double()
    hand = torch.relu(x @ ts.encoder[layer, :, f].double() + ts.encoder_bias[layer, f].double())  # [row pos]
    top = hand.flatten().topk(len(record["contexts"]))
    assert [divmod(i, text.shape[1]) for i in top.indices.tolist()] == [(c["row"], c["pos"]) for c in record["contexts"]]
    for c in record["contexts"]:
        want = hand[c["row"], c["start"]:c["start"] + len(c["acts"])]
        assert torch.allclose(torch.tensor(c["acts"], dtype=torch.float64), want, atol=1e-5, rtol=0)  # measured 6.1e-7 (float32 encode)
        assert c["tokens"] == [f"#{t}" for t in text[c["row"], c["start"]:c["start"] + len(c["acts"])].tolist()]
    # the decoder row (one target: a per-layer set) centred and scaled by ln_final's weight, then W_U
    d = ts.decoders[layer][f, 0].double()
    effect = ((d - d.mean()) * model.ln_final.w.double()) @ model.W_U.double()
    up = effect.topk(5)
    assert [t for t, _ in record["top_logits"]] == [f"#{i}" for i in up.indices.tolist()]
    assert torch.allclose(torch.tensor([v for _, v in record["top_logits"]], dtype=torch.float64), up.values,
                          atol=2e-6, rtol=0)  # measured 4.8e-8 (float32 vs float64)
    down = (-effect).topk(5)
    assert [t for t, _ in record["bottom_logits"]] == [f"#{i}" for i in down.indices.tolist()]

    # grouping two nodes: one box, its edges the sums of its members' edges over the pruned adjacency
    assert seen["chosen"] == 2 and seen["rects"] == 1 and seen["group_label"] == 1
    assert seen["after_group"] == seen["circles"] - 2
    members = [node_index(graph, g) for g in group]
    shown_ids = {n["node_id"]: node_index(graph, n["node_id"]) for n in data["nodes"]}
    mask = pruned.edge_mask
    A = graph.adjacency.double()
    want = {}
    for other, j in shown_ids.items():
        if other in group:
            continue
        into = sum(float(A[m, j]) for m in members if mask[m, j])
        out_of = sum(float(A[j, m]) for m in members if mask[j, m])
        if any(mask[m, j] and A[m, j] != 0 for m in members):
            want[(other, "super_0")] = into
        if any(mask[j, m] and A[j, m] != 0 for m in members):
            want[("super_0", other)] = out_of
    got = {(s, t): w for s, t, w in seen["super_edges"]}
    assert set(got) == set(want) and len(want) >= 2
    for k in want:
        # two float64 terms summed in either order: one rounding at most (measured 0)
        assert abs(got[k] - want[k]) <= 1e-12 * max(1.0, abs(want[k])), (k, got[k], want[k])
    assert seen["super_info"].startswith('supernode "my <group>" (2 nodes)')
    assert seen["after_ungroup"] == [seen["circles"], 0, seen["lines"]]


def test_graph_page_layout_and_screenshot(tmp_path):
    """No node (circle or supernode box) leaves the graph pane (left, right, top or bottom) at 800 and 1400 px; the
    screenshot at 1400 px shows the blue and red edges."""
    browser = find_browser()
    _, _, graph, _, data, _, details = build(tmp_path)
    path = tmp_path / "layout.html"
    page = graph_page(data, graph.n_layers, details=details)
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", BOUNDS + "</body>", 1))
    for width in (800, 1400):
        seen, _ = run_in_browser(browser, str(path), (width, 900))
        assert seen["errors"] == []
        left, right, top, bottom = seen["pane"]
        bad = [n for n in seen["nodes"] if n[1] < left - 0.5 or n[2] > right + 0.5 or n[3] < top - 0.5 or n[4] > bottom + 0.5]
        assert len(seen["nodes"]) == len(data["nodes"]) and bad == [], (width, seen["pane"], bad)
        assert seen["page"][0] <= seen["page"][1], (width, seen["page"])  # no horizontal scroll
    clean = tmp_path / "shot.html"
    clean.write_text(page)
    w, h, rows = screenshot(browser, str(clean), str(tmp_path / "graph.png"), (1400, 900))
    assert (w, h) == (1400, 900)
    blue = sum(1 for row in rows for p in row if p[2] > 150 and p[0] < 120 and p[1] < 170)
    red = sum(1 for row in rows for p in row if p[0] > 150 and p[1] < 110 and p[2] < 110)
    assert blue > 400 and red > 300, (blue, red)  # measured 1633 and 1472
