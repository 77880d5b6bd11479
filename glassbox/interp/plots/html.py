"""Self-contained HTML: figures and the attention viewer, with plotly.js inlined.

``save_html`` writes one file holding plotly.js once and every figure after it; it loads nothing
from the network (no CDN, no MathJax, no fonts), so it opens on a machine with no network at all.
``attention_viewer_html`` is the page of ``glassbox attention``: a layer and a head selector above one
heatmap, the tokens on both axes and the probability on hover; switching selectors restyles the
heatmap in place from data embedded in the page.

Every page redraws its figures at their containers' sizes once it has loaded and whenever a
container changes size (``FIT``): plotly alone sizes a figure when it first draws it, before the rest
of the page exists, so a figure in a flex cell would overflow the cell.

Footgun: plotly.js is ~5 MB, so every file that inlines it is at least that big; put many figures in
one file, or write several pages with ``page(..., plotly_src=PLOTLY_ASSET)`` that load one
``plotly.min.js`` written next to them (``write_plotly_asset``), which is still offline.
"""

import html
import json
from pathlib import Path
from typing import Optional, Sequence, Union

from jaxtyping import Float
from torch import Tensor

from ...fs import write_text
from .attention import COLOURS, check_square, hover_text
from .common import go, index_axis, to_list

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
.controls label {{ margin-right: 1.5em; }}
.tokens {{ font-family: monospace; white-space: pre-wrap; color: #444; }}
</style>
{plotly}
{fit}
</head>
<body>
<h1>{title}</h1>
{body}
</body>
</html>
"""


# Plotly sizes a figure to its container when it draws it, which is before the rest of the page exists:
# a figure in a flex cell is drawn at the row's full width, then its cell shrinks and the drawing
# overflows it. Once the page has loaded, and whenever a figure's container changes size (a window
# resize, a notebook cell), every figure is redrawn at its container's size.
FIT = """<script type="text/javascript">
(function () {
  function fit(gd) { if (window.Plotly && gd._fullLayout) { Plotly.relayout(gd, {autosize: true}); } }
  window.addEventListener("load", function () {
    var graphs = Array.prototype.slice.call(document.querySelectorAll(".plotly-graph-div"));
    graphs.forEach(fit);
    if (!window.ResizeObserver) { return; }
    var widths = new Map(), pending = null;
    var observer = new ResizeObserver(function (entries) {
      entries.forEach(function (e) {
        var w = Math.round(e.contentRect.width);
        if (widths.has(e.target) && widths.get(e.target) !== w) {
          clearTimeout(pending); pending = setTimeout(function () { graphs.forEach(fit); }, 50);
        }
        widths.set(e.target, w);
      });
    });
    graphs.forEach(function (gd) { observer.observe(gd.parentElement); });
  });
})();
</script>"""


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


PLOTLY_ASSET = "plotly.min.js"  # the shared file's name, written next to the pages that load it


def page(title: str, body: str, plotly_src: Optional[str] = None) -> str:
    """A page around ``body``: plotly.js inlined (``plotly_src`` None: the page stands alone, ~5 MB), or loaded
    from the relative path ``plotly_src`` (a file next to the page, ``write_plotly_asset``; still offline)."""
    if plotly_src is None:
        script = f'<script type="text/javascript">{plotly_js()}</script>'
    else:
        if not isinstance(plotly_src, str) or not plotly_src or "://" in plotly_src or plotly_src.startswith("/"):
            raise ValueError(f"plotly_src must be a relative path to a file next to the page, got {plotly_src!r}")
        script = f'<script type="text/javascript" src="{html.escape(plotly_src)}"></script>'
    return PAGE.format(title=html.escape(title), plotly=script, fit=FIT, body=body)


def write_plotly_asset(folder: Union[str, Path]) -> Path:
    """``folder/plotly.min.js``, the plotly.js that pages made with ``plotly_src=PLOTLY_ASSET`` load; written
    (crash-safe, glassbox.fs) only when it is missing or holds another version."""
    path = Path(folder) / PLOTLY_ASSET
    js = plotly_js()
    try:
        if path.is_file() and path.read_text(encoding="utf-8") == js:
            return path
    except (OSError, UnicodeDecodeError):  # unreadable or not text: rewrite it
        pass
    return write_text(path, js)


def save_html(fig_or_figs, path: Union[str, Path], title: str = "glassbox") -> Path:
    """Write one figure, or a list of them, to a single offline HTML file; returns the path."""
    figs = list(fig_or_figs) if isinstance(fig_or_figs, (list, tuple)) else [fig_or_figs]
    if not figs:
        raise ValueError("save_html needs at least one figure")
    Figure = go().Figure
    for fig in figs:
        if not isinstance(fig, Figure):
            raise TypeError(f"save_html takes plotly Figures, got {type(fig).__name__}")
    # include_mathjax=False and our own <script> keep the page free of any network reference.
    body = "\n".join(fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False) for fig in figs)
    # written whole (glassbox.fs): a failure or a kill leaves the old page, never half a page
    return write_text(path, page(title, body))


VIEWER = """
<div class="controls">
  <label>layer <select id="layer">{layer_options}</select></label>
  <label>head <select id="head">{head_options}</select></label>
</div>
<p class="tokens" id="tokens">{tokens}</p>
<div id="attention" style="width: 100%; height: {height}px;"></div>
<script type="text/javascript">
(function () {{
  var patterns = {patterns};  // [layer][head][query][key]
  var figure = {figure};
  var graph = document.getElementById("attention");
  var layer = document.getElementById("layer"), head = document.getElementById("head");
  Plotly.newPlot(graph, figure.data, figure.layout, {{responsive: true}});
  function show() {{
    var l = Number(layer.value), h = Number(head.value);
    Plotly.restyle(graph, {{z: [patterns[l][h]]}}, [0]);
    Plotly.relayout(graph, {{"title.text": "layer " + l + ", head " + h}});
  }}
  layer.addEventListener("change", show);
  head.addEventListener("change", show);
  window.glassboxViewer = {{patterns: patterns, show: show}};
}})();
</script>
"""


def attention_viewer_html(patterns: Float[Tensor, "layer head query_pos key_pos"], tokens: Optional[Sequence] = None,
                          title: str = "attention patterns") -> str:
    """The offline viewer page for patterns [layer head query_pos key_pos] of one prompt."""
    if patterns.ndim != 4:
        raise ValueError(f"the viewer takes [layer head query_pos key_pos], got shape {tuple(patterns.shape)}")
    labels = check_square(patterns, tokens)
    n_layers, n_heads = patterns.shape[:2]
    values = to_list(patterns, 5)
    heatmap = go().Heatmap(z=values[0][0], text=hover_text(labels), zmin=0.0, zmax=1.0, colorscale=COLOURS,
                           hovertemplate="%{text}<br>p = %{z:.4f}<extra></extra>")
    height = min(1200, max(420, 28 * len(labels) + 160))
    layout = dict(title=dict(text="layer 0, head 0"), xaxis=index_axis(labels, "key"),
                  yaxis=dict(index_axis(labels, "query"), autorange="reversed"), height=height)
    figure = go().Figure(heatmap, layout).to_plotly_json()
    options = lambda n: "".join(f'<option value="{i}">{i}</option>' for i in range(n))
    body = VIEWER.format(layer_options=options(n_layers), head_options=options(n_heads),
                         tokens=html.escape(" | ".join(labels)), height=height, patterns=json.dumps(values),
                         figure=json_for_script(figure))
    return page(title, body)


def json_for_script(obj) -> str:
    """JSON safe inside a <script> element (no '</' that could close it)."""
    from plotly.io.json import to_json_plotly

    return to_json_plotly(obj).replace("</", "<\\/")
