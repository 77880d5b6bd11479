"""The attribution-graph page in headless Chromium (the harness of test_viewer_browser.py): it draws every
node and link, places logits above features above tokens, a click shows the node, pinning and "show pinned"
leave only the pinned node, and it loads nothing and raises nothing."""

from glassbox.interp.graphs import attribute
from glassbox.interp.graphs.export import frontend_json
from glassbox.interp.graphs.page import graph_page
from glassbox.interp.graphs.prune import prune_graph
from tests.graph_models import family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens
from tests.test_viewer_browser import CAPTURE, find_browser, probe, run_in_browser

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
    var target = document.querySelector('circle[data-id="' + D.nodes.find(function (d) { return d.feature_type === "logit"; }).node_id + '"]');
    target.dispatchEvent(new MouseEvent("click"));
    out.info = document.getElementById("info").textContent;
    document.getElementById("pin").click();
    document.getElementById("only").click();
    out.after_pin = document.querySelectorAll("circle").length;
    out.pinned_class = document.querySelectorAll("circle.pinned").length;
    document.getElementById("all").click();
    out.after_all = document.querySelectorAll("circle").length;
    out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  } catch (e) { out.exception = String(e && e.stack || e); }
""")


def test_graph_page_in_headless_chromium(tmp_path):
    browser = find_browser()
    model, _ = family_model("gpt2")
    graph = attribute(model, family_transcoders("gpt2"), prompt_tokens("induction", 3, 53))
    pruned = prune_graph(graph, 0.8, 0.98)
    toks = [f"<t{i}>" for i in range(graph.n_pos)]  # markup in token text must stay text
    data = frontend_json(graph, pruned, slug="g", prompt="</script><b>p</b>", token_strings=toks,
                         logit_strings=[f"l{i}" for i in range(graph.n_logits)])
    page = graph_page(data, graph.n_layers)
    path = tmp_path / "probe.html"
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", PROBE + "</body>", 1))
    seen, stderr = run_in_browser(browser, str(path))
    assert "exception" not in seen, seen.get("exception")
    assert seen["errors"] == [] and seen["resources"] == []
    assert seen["circles"] == len(data["nodes"]) > 5
    assert seen["lines"] == len(data["links"]) > 5
    y = seen["y"]
    assert max(y["logit"]) < min(y["cross layer transcoder"]) and max(y["cross layer transcoder"]) < min(y["embedding"])
    assert seen["info"].startswith("Output") and "strongest inputs" in seen["info"]
    assert seen["after_pin"] == 1 and seen["pinned_class"] == 1 and seen["after_all"] == seen["circles"]
