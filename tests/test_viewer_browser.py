"""The attention viewer page of ``glassbox attention``, opened in a real headless Chromium.

Chromium (Debian's ``chromium`` package) loads the page from a file with every host name resolving to
nothing, so any network fetch would fail and be reported. A script injected before anything else
records console errors, uncaught exceptions and failed resource loads; a second one, run after the
page has loaded, reads the rendered heatmap, hovers one cell, switches the head selector and writes
what it saw into the DOM, which ``--dump-dom`` prints. The expected numbers come from the model run
here, not from the page.

Skipped only when no Chromium is installed and CI is not set; with CI=true (as ``.ci/run`` sets) a
missing browser is a failure.
"""

import html
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest
import torch

from glassbox.cli import main as cli_main
from glassbox.cli.attention import build_model, patterns_of

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PROMPT = "The cat sat on the mat. The cat"

CAPTURE = """<script>
window.__gbErrors = [];
(function () {
  var original = console.error;
  console.error = function () {
    window.__gbErrors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
  window.addEventListener("error", function (e) {
    window.__gbErrors.push("error: " + (e.message || (e.target && (e.target.src || e.target.href)) || "a resource failed"));
  }, true);
  window.addEventListener("unhandledrejection", function (e) { window.__gbErrors.push("unhandled rejection: " + e.reason); });
})();
</script>"""


def probe(body: str, delay_ms: int = 100) -> str:
    """A script that, once the page has loaded and drawn, runs ``body`` (which fills ``out``) and
    writes ``out`` with the captured errors as JSON into <pre id="gb-test-results">."""
    return """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var out = {};
""" + body + """  out.errors = window.__gbErrors;
  var pre = document.createElement("pre");
  pre.id = "gb-test-results";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, """ + str(delay_ms) + """); });
</script>"""


PROBE = probe("""  try {
    var gd = document.getElementById("attention");
    out.heatmap_layers = gd.querySelectorAll(".hm").length;
    out.heatmap_images = gd.querySelectorAll(".hm image").length;
    out.z = gd.data[0].z;
    out.yticks = Array.prototype.map.call(gd.querySelectorAll(".ytick text"), function (n) { return n.textContent; });
    out.xticks = Array.prototype.map.call(gd.querySelectorAll(".xtick text"), function (n) { return n.textContent; });
    Plotly.Fx.hover(gd, {xval: 1, yval: 2}, "xy");
    out.hover = Array.prototype.map.call(gd.querySelectorAll(".hoverlayer .hovertext"), function (n) { return n.textContent; });
    var layer = document.getElementById("layer"), head = document.getElementById("head");
    head.value = "1"; head.dispatchEvent(new Event("change"));
    out.z_head1 = gd.data[0].z;
    layer.value = "1"; head.value = "3"; layer.dispatchEvent(new Event("change"));
    out.z_layer1_head3 = gd.data[0].z;
    out.title = gd.layout.title.text;
    out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  } catch (e) { out.exception = String(e && e.stack || e); }
""")


FIGURES_PROBE = probe("""  var divs = document.querySelectorAll(".plotly-graph-div");
  out.graphs = divs.length;
  out.rendered = Array.prototype.filter.call(divs, function (d) { return d.querySelector(".main-svg") !== null; }).length;
  out.heatmaps = document.querySelectorAll(".hm image").length;
  out.resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
""")


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI is set but no Chromium ({', '.join(BROWSERS)}) is installed; .ci/run must install "
                    "Debian's chromium package")
    pytest.skip(f"Chromium not installed ({', '.join(BROWSERS)} not on PATH) and CI is not set: the viewer's "
                "browser test runs only where a browser exists (apt-get install chromium)")


def browser_command(browser: str, profile: str, window: tuple) -> list:
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr",
            "--v=0", "--virtual-time-budget=10000", f"--window-size={window[0]},{window[1]}"]


def run_in_browser(browser: str, page_path: str, window: tuple = (1280, 900)) -> tuple:
    """(what the probe wrote, Chromium's stderr) for the page at ``page_path`` in a ``window`` (width, height)."""
    profile = tempfile.mkdtemp(prefix="glassbox-chromium-")
    try:
        done = subprocess.run(browser_command(browser, profile, window) + ["--dump-dom", f"file://{page_path}"],
                              capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    found = re.search(r'<pre id="gb-test-results">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the probe wrote no results (exit {done.returncode}); stderr tail:\n{done.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1))), done.stderr


def screenshot(browser: str, page_path: str, png_path: str, window: tuple) -> tuple:
    """Chromium's screenshot of the page's first ``window`` (width, height): (width, height, pixels), the
    pixels a list of rows of (r, g, b) tuples."""
    profile = tempfile.mkdtemp(prefix="glassbox-chromium-")
    try:
        subprocess.run(browser_command(browser, profile, window) + [f"--screenshot={png_path}", f"file://{page_path}"],
                       capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert os.path.isfile(png_path), "Chromium wrote no screenshot"
    return read_png(png_path)


def read_png(path: str) -> tuple:
    """(width, height, rows of (r, g, b)) of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    import struct
    import zlib

    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


# Measures every plotly figure against the cell it sits in: the figure's div, its drawn SVG and its axis
# titles must lie inside the cell, and the page must not scroll sideways.
LAYOUT = """  var cells = [];
  Array.prototype.forEach.call(document.querySelectorAll(".plotly-graph-div"), function (gd) {
    var cell = gd.parentElement.getBoundingClientRect(), own = gd.getBoundingClientRect();
    var svg = gd.querySelector(".main-svg"), drawn = svg ? svg.getBoundingClientRect() : null;
    var titles = Array.prototype.map.call(gd.querySelectorAll(".xtitle, .ytitle, .gtitle"), function (t) {
      var r = t.getBoundingClientRect(); return [t.textContent, r.left, r.right]; });
    cells.push({id: gd.id, cell: [cell.left, cell.right], div: [own.left, own.right],
                svg: drawn ? [drawn.left, drawn.right] : null, titles: titles,
                layout_width: gd._fullLayout ? gd._fullLayout.width : null});
  });
  out.cells = cells;
  out.page = [document.documentElement.scrollWidth, window.innerWidth];
"""


def overflowing(seen: dict, slack: float = 1.0) -> list:
    """The figures (by id) whose div, SVG or an axis title leaves its cell, from the LAYOUT probe."""
    bad = []
    for c in seen["cells"]:
        left, right = c["cell"]
        spans = [("div", c["div"]), ("svg", c["svg"])] + [(f"title {t!r}", (l, r)) for t, l, r in c["titles"]]
        for what, span in spans:
            if span is None or span[0] < left - slack or span[1] > right + slack:
                bad.append((c["id"], what, span, (left, right)))
    return bad


def close(a, b, atol=1e-4) -> bool:  # the page's numbers are rounded to 5 decimals (error <= 5e-6)
    return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=atol, rtol=0)


def test_viewer_page_in_headless_chromium(tmp_path):
    browser = find_browser()
    out = tmp_path / "view.html"
    assert cli_main(["attention", "--model", "random", "--prompt", PROMPT, "--out", str(out)]) == 0
    source = out.read_text(encoding="utf-8")
    assert "<script src" not in source and "<link" not in source, "the page must not load anything"

    # The expected patterns, computed here from the same seeded default model.
    model = build_model("random", None, seed=0)
    tokens = model.to_tokens(PROMPT)
    patterns = patterns_of(model, tokens).to(torch.float64)
    labels = model.to_str_tokens(tokens[0])
    n = len(labels)
    assert labels.count(" cat") == 2 and labels.count(" The") == 1  # a repeated token must keep two rows

    probe = tmp_path / "probe.html"
    probe.write_text(source.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", PROBE + "</body>", 1),
                     encoding="utf-8")
    seen, stderr = run_in_browser(browser, str(probe))

    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert not [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    assert [r for r in seen["resources"] if not r.startswith("file:")] == [], "the page fetched something"
    assert seen["heatmap_layers"] == 1 and seen["heatmap_images"] == 1, "no rendered heatmap"
    assert len(seen["z"]) == n and all(len(row) == n for row in seen["z"]), "query x key rows"
    assert len(seen["yticks"]) == n and len(seen["xticks"]) == n, (seen["yticks"], seen["xticks"])
    assert seen["yticks"].count("\u00b7cat") == 2, seen["yticks"]  # repeated token: two rows
    assert close(seen["z"], patterns[0, 0].tolist())
    assert "p = " in seen["hover"][0] and f"{patterns[0, 0, 2, 1].item():.4f}" in seen["hover"][0], seen["hover"]
    # Switching head (then layer and head) shows that head's values.
    assert close(seen["z_head1"], patterns[0, 1].tolist())
    assert not close(seen["z_head1"], seen["z"])
    assert close(seen["z_layer1_head3"], patterns[1, 3].tolist())
    assert seen["title"] == "layer 1, head 3"


def test_saved_figures_open_offline(tmp_path):
    from glassbox.interp.plots import attention_grid, patching_heatmap, save_html

    browser = find_browser()
    patterns = torch.rand(3, 5, 5).tril().softmax(-1)
    figs = [attention_grid(patterns, ["a", "b", "a", "c", "d"]), patching_heatmap(torch.randn(4, 5))]
    page = save_html(figs, tmp_path / "figs.html").read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", FIGURES_PROBE + "</body>", 1),
                     encoding="utf-8")
    seen, _ = run_in_browser(browser, str(probe))
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert [r for r in seen["resources"] if not r.startswith("file:")] == []
    assert seen["graphs"] == 2 and seen["rendered"] == 2 and seen["heatmaps"] == 3 + 1
