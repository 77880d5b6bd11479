"""The demo's pages in headless Chromium: the attention section opens on the head its caption names,
the patching axis and caption name the same tokens, the caption links features.html, every figure fits
its cell, and the pages load plotly.js from one shared plotly.min.js beside them (nothing from the
network), or inline it with ``single_file=True``. The expected head and patterns are computed here from
the model's own cache, not read from the page."""

import json
import re

import pytest
import torch

from glassbox.interp.report import DEFAULT_PROMPT, build_report
from glassbox.interp.report_features import shipped_sae
from glassbox.models import HookedTransformer
from test_viewer_browser import CAPTURE, LAYOUT, find_browser, overflowing, probe, run_in_browser, screenshot


@pytest.fixture(scope="module")
def austen():
    return HookedTransformer.from_pretrained("glassbox-austen")


@pytest.fixture(scope="module")
def report(austen, tmp_path_factory):
    from glassbox.train.data import split_text

    out = tmp_path_factory.mktemp("demo")
    text = split_text(open("data/austen.txt", encoding="utf-8").read(), 0.05)[1][:3000]
    summary = build_report(austen, DEFAULT_PROMPT, " letter", " garden", out, sae=shipped_sae(austen), feature_text=text)
    return out, summary


PROBE = probe(LAYOUT + """  try {
    var gd = document.getElementById("figure-attention");
    out.attention_title = gd.layout.title.text;
    out.attention_z = gd.data[0].z;
    out.attention_active = gd.layout.updatemenus[0].active;
    out.attention_caption = document.getElementById("caption-attention").textContent;
    var patch = document.getElementById("figure-patching");
    out.patching_ticks = patch.layout.xaxis.ticktext;
    out.patching_caption = document.getElementById("caption-patching").textContent;
    out.links = Array.prototype.map.call(document.querySelectorAll("#caption-features a"),
                                         function (a) { return a.getAttribute("href"); });
    var divs = document.querySelectorAll(".plotly-graph-div");
    out.graphs = divs.length;
    out.rendered = Array.prototype.filter.call(divs, function (d) { return d.querySelector(".main-svg") !== null; }).length;
  } catch (e) { out.exception = String(e && e.stack || e); }
  out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
""", delay_ms=1000)

RENDERED = probe(LAYOUT + """  var divs = document.querySelectorAll(".plotly-graph-div");
  out.graphs = divs.length;
  out.rendered = Array.prototype.filter.call(divs, function (d) { return d.querySelector(".main-svg") !== null; }).length;
  out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
""", delay_ms=1000)


def with_probe(page_path, probe_script, name):
    path = page_path.parent / name  # beside the page, so that its relative plotly.min.js resolves
    source = page_path.read_text(encoding="utf-8")
    path.write_text(source.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", probe_script + "</body>", 1),
                    encoding="utf-8")
    return path


def test_report_pages_in_headless_chromium(austen, report):
    browser = find_browser()
    out, summary = report
    seen, _ = run_in_browser(browser, str(with_probe(out / "index.html", PROBE, "probe-index.html")), window=(1400, 1000))
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [], seen["errors"]
    assert [r for r in seen["resources"] if not r.startswith("file:")] == [], "the page fetched something"
    # drawn, so plotly.js came from plotly.min.js (file: loads are not in Chromium's resource timing)
    assert seen["graphs"] == seen["rendered"] == 8, (seen["graphs"], seen["rendered"])
    assert overflowing(seen) == [], overflowing(seen)

    # The head the caption names, found here: from the last token, most attention to the first ' letter'.
    tokens = austen.to_tokens(DEFAULT_PROMPT)
    _, cache = austen.run_with_cache(tokens)
    patterns = torch.stack([cache["pattern", layer][0] for layer in range(austen.cfg.n_layers)]).double()
    replaced = austen.to_str_tokens(tokens[0]).index(" letter")
    layer, head = divmod(int(patterns[:, :, -1, replaced].flatten().argmax()), austen.cfg.n_heads)
    assert (layer, head) == (1, 0)  # the induction head; the section opened on L0H0 before
    assert f"is L{layer}H{head}," in seen["attention_caption"], seen["attention_caption"]
    assert seen["attention_title"].endswith(f"layer {layer}, head {head}"), seen["attention_title"]
    assert seen["attention_active"] == layer * austen.cfg.n_heads + head
    # rounded to 5 decimals on the page: error <= 5e-6
    assert torch.allclose(torch.tensor(seen["attention_z"], dtype=torch.float64), patterns[layer, head], atol=1e-5, rtol=0)

    # The patching axis and caption name the same token at the corrupted position (the axis showed the
    # corrupted prompt's ' garden' where the caption said ' letter').
    assert seen["patching_ticks"][replaced] == "·letter\u2192·garden", seen["patching_ticks"][replaced]
    assert f"token {replaced} (' letter' clean, ' garden' corrupted)" in seen["patching_caption"], seen["patching_caption"]
    assert seen["links"] == ["features.html"] and (out / "features.html").is_file()

    seen, _ = run_in_browser(browser, str(with_probe(out / "features.html", RENDERED, "probe-features.html")),
                             window=(1400, 1000))
    assert seen["errors"] == [] and [r for r in seen["resources"] if not r.startswith("file:")] == []
    assert seen["graphs"] == seen["rendered"] == 2 * len(summary["features"]["top_features"])
    assert overflowing(seen) == [], overflowing(seen)


def test_report_screenshot(report, tmp_path):
    """The first screen of the report at 1400 px, drawn from the shared plotly.min.js: the tables' header
    colour and the attention heatmap's blues are on it (a page whose plotly.js failed to load is text only)."""
    browser = find_browser()
    out, _ = report
    width, height, rows = screenshot(browser, str(out / "index.html"), str(tmp_path / "index.png"), (1400, 1400))
    assert (width, height) == (1400, 1400)
    colours = {p for row in rows for p in row}
    dark_blue = [p for p in colours if p[2] > 100 and p[0] < 40 and p[1] < 90]  # Blues' dark end, e.g. (8, 48, 107)
    assert len(colours) > 200 and dark_blue, (len(colours), len(dark_blue))


def test_shared_asset_sizes_and_single_file(austen, report, tmp_path):
    out, _ = report
    asset = (out / "plotly.min.js").stat().st_size
    index, features = (out / "index.html").stat().st_size, (out / "features.html").stat().st_size
    # measured (glassbox demo): plotly.min.js 4,815,814 bytes, index.html 115,716 and features.html 154,309 beside it;
    # inlined, 4,931,510 and 4,970,103
    assert 3_000_000 < asset < 8_000_000 and index < 400_000 and features < 400_000, (asset, index, features)
    for page in ("index.html", "features.html"):
        source = (out / page).read_text(encoding="utf-8")
        assert source.count('<script type="text/javascript" src="plotly.min.js"></script>') == 1
        assert "http://" not in source.replace("http://www.w3.org", "") and "https://" not in source, page
    single = tmp_path / "single"
    build_report(austen, DEFAULT_PROMPT, " letter", " garden", single, single_file=True)
    source = (single / "index.html").read_text(encoding="utf-8")
    assert "<script src" not in source and 'src="plotly.min.js"' not in source and len(source) > 3_000_000
    assert not (single / "plotly.min.js").exists()
    seen, _ = run_in_browser(find_browser(), str(with_probe(single / "index.html", RENDERED, "probe.html")))
    assert seen["errors"] == [] and seen["resources"] == [] and seen["graphs"] == seen["rendered"] == 7


def test_an_answer_without_its_leading_space_is_refused_with_the_spaced_spelling(austen):
    """``glassbox demo --answer letter`` built the prompt 'Elizabeth read theletter again, ...' and ran on it."""
    from glassbox.cli.demo import choose_story
    from glassbox.cli.errors import UsageError

    with pytest.raises(UsageError) as raised:
        choose_story(austen, None, "letter", None)
    message = str(raised.value)
    assert "--answer 'letter' has no leading space" in message and "'Jane readletter. Jane read'" in message
    assert "give --answer ' letter' (one token)" in message, message
    story = choose_story(austen, "Elizabeth read the letter, and Elizabeth read the", " letter", None)
    assert story.prompt == "Elizabeth read the letter, and Elizabeth read the"  # a prompt of one's own is kept
