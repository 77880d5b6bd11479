"""``glassbox.interp.plots.vis``, the offline CircuitsVis-style views: the arguments CircuitsVis users
pass, refusals naming what is wrong, and each view in headless Chromium with no network request,
every head selectable and every number shown equal to the one computed here."""

import pytest
import torch

from glassbox.interp.plots import vis as cv
from test_viewer_browser import CAPTURE, find_browser, probe, run_in_browser, screenshot

TOKENS = ["<bos>", " the", " cat", "<b>x</b>", " the", " mat", "\n"]  # a repeated token and markup, 7 positions


def patterns(n_heads=3, n=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_heads, n, n, generator=g).masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    return scores.softmax(-1)


def test_the_circuitsvis_signatures_and_what_they_return(tmp_path):
    a = patterns()
    view = cv.attention_heads(a, TOKENS, attention_head_names=["L0H0", "L0H1", "L0H2"], max_value=1.0, min_value=0.0,
                              negative_color="red", positive_color="#1f5fb4", mask_upper_tri=True)
    assert view._repr_html_() == str(view) and "<script src" not in str(view) and "http" not in str(view)
    assert repr(view) == "<glassbox attention_heads: 3 heads x 7 tokens>"
    assert "&lt;b&gt;x&lt;/b&gt;" not in str(view) and "<b>x</b>" not in str(view).split("application/json", 1)[0]
    assert repr(cv.attention_patterns(TOKENS, a.numpy())) == "<glassbox attention_heads: 3 heads x 7 tokens>"
    assert repr(cv.attention_pattern(TOKENS, a[0].tolist())) == "<glassbox attention_heads: 1 head x 7 tokens>"
    assert repr(cv.colored_tokens(TOKENS, torch.arange(7.0) - 3)) == "<glassbox colored_tokens: 7 tokens>"
    top = cv.topk_tokens([TOKENS, TOKENS[:5]], [torch.randn(2, 7, 11), torch.randn(2, 5, 11).numpy()], max_k=3,
                         first_dimension_name="Layer", third_dimension_name="Neuron")
    assert repr(top) == "<glassbox topk_tokens: 2 samples, 2 layers x 11 neurons>"
    page = view.save(tmp_path / "sub" / "v.html", title="heads")
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and str(view) in text and "<title>heads</title>" in text
    # bfloat16 and float64 inputs read the same numbers (as float64 on the CPU)
    assert str(cv.colored_tokens(TOKENS[:2], torch.tensor([0.5, -0.25], dtype=torch.bfloat16))).count("0.5") >= 1


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: cv.attention_heads(patterns()[:, :6], TOKENS[:6]), ValueError, "dest = src"),
    (lambda: cv.attention_heads(patterns(), TOKENS[:6]), ValueError, "tokens has 6 entries but the values have 7"),
    (lambda: cv.attention_heads(patterns()[0, 0], TOKENS), ValueError, "attention must have 2 dimensions or 3"),
    (lambda: cv.attention_heads(patterns().index_put((torch.tensor(1), torch.tensor(4), torch.tensor(2)),
                                                     torch.tensor(float("nan"))), TOKENS),
     ValueError, "attention[1, 4, 2] is nan"),
    (lambda: cv.attention_heads(patterns(), TOKENS[:6] + [7]), TypeError, "tokens[6] is int"),
    (lambda: cv.attention_heads(patterns(), "the cat"), TypeError, "tokens must be a list of strings"),
    (lambda: cv.attention_heads(patterns(), TOKENS, ["a", "b"]), ValueError, "attention_head_names has 2 entries"),
    (lambda: cv.attention_heads(patterns(), TOKENS, positive_color="red; background: url(x)"), ValueError,
     "positive_color must be a CSS colour"),
    (lambda: cv.attention_heads(patterns(), TOKENS, max_value=float("inf")), ValueError, "max_value must be a finite number, got inf"),
    (lambda: cv.attention_heads(patterns(), TOKENS, min_value=2.0, max_value=1.0), ValueError, "min_value 2.0 is above"),
    (lambda: cv.attention_heads("x", TOKENS), TypeError, "attention must be a tensor"),
    (lambda: cv.colored_tokens(TOKENS, torch.ones(6)), ValueError, "tokens has 7 entries but the values have 6"),
    (lambda: cv.topk_tokens([TOKENS], [torch.randn(2, 7, 3)], max_k=0), ValueError, "max_k must be a positive int"),
    (lambda: cv.topk_tokens([TOKENS, TOKENS], [torch.randn(2, 7, 3)]), ValueError, "one array per sample (2)"),
    (lambda: cv.topk_tokens([TOKENS, TOKENS], [torch.randn(2, 7, 3), torch.randn(2, 7, 4)]), ValueError,
     "activations[1] has shape (2, 7, 4)"),
    (lambda: cv.topk_tokens([TOKENS], [torch.randn(2, 6, 3)]), ValueError, "tokens[0] has 7 entries"),
])
def test_bad_input_is_refused_naming_it(call, error, fragment):
    with pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value), str(raised.value)


PROBE = probe("""  try {
    var views = document.querySelectorAll(".gb-attention");
    out.views = views.length;
    out.heads = Array.prototype.map.call(views, function (root) {
      var seen = [];
      Array.prototype.forEach.call(root.querySelectorAll(".gb-thumb"), function (button) {
        button.click();
        var rows = Array.prototype.map.call(root.querySelectorAll(".gb-grid tbody tr"), function (tr) {
          return Array.prototype.map.call(tr.querySelectorAll("td"), function (td) {
            var v = td.getAttribute("data-value"); return v === null ? null : Number(v); }); });
        seen.push([Number(root.getAttribute("data-selected")), root.querySelector(".gb-selected").textContent, rows,
                   button.getAttribute("aria-pressed")]);
      });
      root.querySelectorAll(".gb-grid tbody th")[2].click();
      seen.push(Array.prototype.map.call(root.querySelectorAll(".gb-strip .gb-tok"), function (s) {
        return Number(s.getAttribute("data-value")); }));
      return seen;
    });
    out.row_labels = Array.prototype.map.call(views[0].querySelectorAll(".gb-grid tbody th"), function (th) {
      return th.textContent; });
    var tokens = document.querySelector(".gb-tokens");
    out.colored = Array.prototype.map.call(tokens.querySelectorAll(".gb-tok"), function (s) {
      return [s.textContent, Number(s.getAttribute("data-value")), s.style.background]; });
    var topk = document.querySelector(".gb-topk").closest(".gb-vis");
    var layer = topk.querySelector("select.gb-first");
    layer.value = "1"; layer.dispatchEvent(new Event("change"));
    var k = topk.querySelector("input.gb-k"); k.value = "3"; k.dispatchEvent(new Event("change"));
    out.topk_shown = topk.getAttribute("data-shown");
    out.topk_top = Array.prototype.map.call(topk.querySelectorAll("tbody tr"), function (tr) {
      return Array.prototype.map.call(tr.querySelectorAll("td"), function (td) {
        return [td.className, td.getAttribute("data-token"), Number(td.getAttribute("data-value"))]; }); });
  } catch (e) { out.exception = String(e && e.stack || e); }
  out.page = [document.documentElement.scrollWidth, window.innerWidth];
  out.views_right = Array.prototype.map.call(document.querySelectorAll(".gb-vis"), function (v) {
    return v.getBoundingClientRect().right; });
  out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
""")


def test_views_in_headless_chromium(tmp_path):
    browser = find_browser()
    first, second = patterns(3, 7, seed=0), patterns(2, 7, seed=1)
    values = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 4.0])
    acts = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(2))
    views = [cv.attention_heads(first, TOKENS, ["L0H0", "L0H1", "L0H2"]), cv.attention_patterns(TOKENS, second),
             cv.colored_tokens(TOKENS, values), cv.topk_tokens([TOKENS], [acts], max_k=4)]
    page = tmp_path / "views.html"
    body = "\n".join(str(v) for v in views)
    page.write_text(f"<!DOCTYPE html><html><head>{CAPTURE}</head><body>{body}{PROBE}</body></html>", encoding="utf-8")
    seen, _ = run_in_browser(browser, str(page), window=(800, 900))
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [] and seen["resources"] == [], (seen["errors"], seen["resources"])
    # at 800 px nothing makes the page scroll sideways: wide tables scroll inside their view
    assert seen["page"][0] <= seen["page"][1] and max(seen["views_right"]) <= 800, (seen["page"], seen["views_right"])
    assert seen["views"] == 2, "two views on one page, each its own"
    assert seen["row_labels"] == ["<bos>", " the", " cat", "<b>x</b>", " the", " mat", "\u21b5"], "tokens as text"
    for attention, names, got in ((first, ["L0H0", "L0H1", "L0H2"], seen["heads"][0]),
                                  (second, ["Head 0", "Head 1"], seen["heads"][1])):
        *heads, strip = got
        assert [h[0] for h in heads] == list(range(len(names))), "every head selectable, in order"
        assert [h[1] for h in heads] == names and all(h[3] == "true" for h in heads)
        for h, (_, _, rows, _) in enumerate(heads):
            # written with 6 decimals: error <= 5e-7
            assert torch.allclose(torch.tensor(rows, dtype=torch.float64), attention[h].double(), atol=1e-6, rtol=0), h
        # after the last head: the strip shows that head's attention from destination token 2
        assert torch.allclose(torch.tensor(strip, dtype=torch.float64), attention[-1, 2].double(), atol=1e-6, rtol=0)
    assert [c[0] for c in seen["colored"]] == [t.replace("\n", "\u21b5") for t in TOKENS]
    assert [c[1] for c in seen["colored"]] == values.tolist()
    # 0 is white; the largest value (4) full blue; -2 (the most negative) full red
    assert "0%" in seen["colored"][2][2] and "100%" in seen["colored"][6][2] and "100%" in seen["colored"][0][2]
    assert seen["topk_shown"] == "0,1,0,5,3"  # sample 0, layer 1, neurons 0..4, k = 3
    top, bottom = acts[1].topk(3, dim=0), acts[1].topk(3, dim=0, largest=False)  # [k neurons] over the 7 tokens
    rows = seen["topk_top"]
    assert len(rows) == 6 and all(len(r) == 5 for r in rows)
    for r in range(3):
        for j in range(5):
            assert rows[r][j][0] == "gb-top" and rows[r][j][1] == TOKENS[int(top.indices[r, j])]
            assert abs(rows[r][j][2] - float(top.values[r, j])) <= 1e-6
            assert rows[3 + r][j][0] == "gb-bottom" and rows[3 + r][j][1] == TOKENS[int(bottom.indices[r, j])]
            assert abs(rows[3 + r][j][2] - float(bottom.values[r, j])) <= 1e-6


def test_saved_view_screenshot(tmp_path):
    """The saved page at 900 px: the head thumbnails and the full-size head are drawn (the default blue)."""
    browser = find_browser()
    path = cv.attention_heads(patterns(4, 9), [f"t{i}" for i in range(9)]).save(tmp_path / "heads.html")
    width, height, rows = screenshot(browser, str(path), str(tmp_path / "heads.png"), (900, 700))
    assert (width, height) == (900, 700)
    blue = sum(1 for row in rows for p in row if p[2] > 150 and p[0] < 100 and p[1] < 140)
    assert blue > 1500, blue
