"""Plot functions: the figures hold exactly the values given, label repeated tokens apart, centre
patching colour scales on zero, never show anything, and export offline HTML."""

import html
import json
import re
import subprocess
import sys

import plotly.graph_objects as go
import pytest
import torch

from glassbox.interp.patching import PatchResult
from glassbox.interp.plots import (attention_grid, attention_pattern, attention_selector, attention_viewer_html,
                                   attribution_bar, logit_lens_plot, patching_heatmap, save_html)

TOKENS = ["<bos>", "The", " cat", " sat", " The", " cat"]  # repeated tokens must stay distinct


@pytest.fixture
def patterns():
    scores = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    return scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


@pytest.fixture(autouse=True)
def never_show(monkeypatch):
    from plotly.basedatatypes import BaseFigure

    def refuse(*args, **kwargs):
        raise AssertionError("a plot function called show()")

    monkeypatch.setattr(BaseFigure, "show", refuse)


def test_importing_plots_does_not_import_plotly():
    code = "import sys, glassbox, glassbox.interp, glassbox.interp.plots; print('plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def assert_token_axis(axis, labels):
    assert list(axis.tickvals) == list(range(len(labels)))  # by index: repeats cannot merge
    # Shown as text: plotly would read "<bos>" as markup, so it arrives as "&lt;bos&gt;".
    assert list(axis.ticktext) == [html.escape(l.replace(" ", "\u00b7") if l != l.strip() else l, quote=False)
                                   for l in labels]


# Figures and the viewer store patterns rounded to 5 decimals (plots/common.py), so a stored value is
# within 5e-6 of the pattern on any machine (measured 5.0e-6); the bounds of 1e-5 below are that.


def test_one_head(patterns):
    fig = attention_pattern(patterns[1, 2], TOKENS, title="L1H2")
    assert isinstance(fig, go.Figure) and len(fig.data) == 1
    heatmap = fig.data[0]
    # measured 3.6e-6 (values up to 1), bound 1e-5: 3x
    torch.testing.assert_close(torch.tensor(heatmap.z, dtype=torch.float64), patterns[1, 2].double(), atol=1e-5, rtol=0)
    assert_token_axis(fig.layout.xaxis, TOKENS)
    assert_token_axis(fig.layout.yaxis, TOKENS)
    assert fig.layout.yaxis.autorange == "reversed" and (heatmap.zmin, heatmap.zmax) == (0.0, 1.0)
    assert "%{z" in heatmap.hovertemplate
    assert heatmap.text[4][2] == "query 4 '\u00b7The'<br>key 2 '\u00b7cat'"


def test_grid_and_selector(patterns):
    grid = attention_grid(patterns[0], TOKENS, cols=2)
    assert [t.type for t in grid.data] == ["heatmap"] * 3
    for head, trace in enumerate(grid.data):
        # measured 5.0e-6 (values up to 1), bound 1e-5: 2x
        torch.testing.assert_close(torch.tensor(trace.z, dtype=torch.float64), patterns[0, head].double(),
                                   atol=1e-5, rtol=0)
    assert [a.text for a in grid.layout.annotations] == ["head 0", "head 1", "head 2"]
    selector = attention_selector(patterns, TOKENS)
    buttons = selector.layout.updatemenus[0].buttons
    assert len(buttons) == 2 * 3 and buttons[5].label == "layer 1 head 2"
    # measured 3.6e-6 (values up to 1), bound 1e-5: 3x
    torch.testing.assert_close(torch.tensor(buttons[5].args[0]["z"][0], dtype=torch.float64), patterns[1, 2].double(),
                               atol=1e-5, rtol=0)


def test_patching_heatmap_is_centred_on_zero_with_token_labels():
    values = torch.tensor([[0.5, -2.0, 1.0, 0.0, 0.25, -0.5], [1.5, 0.0, -1.0, 2.0, 0.0, 0.1]])
    result = PatchResult(values, ("layer", "pos"), {"layer": ["0", "1"], "pos": TOKENS}, "resid_pre", "logit diff")
    fig = patching_heatmap(result)
    assert torch.equal(torch.tensor(fig.data[0].z), values)
    colour = fig.layout.coloraxis
    assert colour.cmin == -2.0 and colour.cmax == 2.0
    assert dict(colour.colorscale)[0.5] == "rgb(247,247,247)"  # white at zero
    assert colour.colorscale[0][1] != colour.colorscale[-1][1]
    assert_token_axis(fig.layout.xaxis, TOKENS)
    assert "logit diff" in fig.layout.title.text
    stacked = PatchResult(torch.stack([values, -values, 3 * values]), ("component", "layer", "pos"),
                          {"component": ["resid_pre", "attn_out", "mlp_out"], "pos": TOKENS}, "every")
    fig = patching_heatmap(stacked)
    assert len(fig.data) == 3 and fig.layout.coloraxis.cmax == 6.0
    assert torch.equal(torch.tensor(fig.data[1].z), -values)
    heads = patching_heatmap(torch.randn(4, 5))  # a bare [layer head] tensor
    assert list(heads.layout.xaxis.tickvals) == list(range(5))


def test_lines_and_bars():
    lens = logit_lens_plot(torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]]), series_labels=[" Mary", " John"])
    assert [t.name for t in lens.data] == [" Mary", " John"] and list(lens.data[1].y) == [0.0, -1.0, 4.0]
    bars = attribution_bar(torch.tensor([0.5, -1.5, 0.0], dtype=torch.float64), ["L0H1", "L1H0", "mlp0"])
    assert list(bars.data[0].y) == [0.5, -1.5, 0.0]
    assert bars.data[0].marker.color[0] != bars.data[0].marker.color[1]


@pytest.mark.parametrize("call, message", [
    (lambda p: attention_pattern(p[0, 0, :, :4], TOKENS), "equal lengths"),
    (lambda p: attention_pattern(p[0, 0], TOKENS[:3]), "3 labels"),
    (lambda p: attention_grid(p, TOKENS), "head query_pos key_pos"),
    (lambda p: patching_heatmap(torch.zeros(2, 2, 2, 2)), "row col"),
    (lambda p: attention_grid(p[0], TOKENS, cols=0), "cols"),
])
def test_bad_input_is_named(patterns, call, message):
    # A wrong rank may be caught by the test suite's jaxtyping checks (a TypeError) before our ValueError.
    with pytest.raises((ValueError, TypeError), match=message):
        call(patterns)


def test_save_html_is_one_offline_file(tmp_path, patterns):
    figs = [attention_pattern(patterns[0, 0], TOKENS), patching_heatmap(torch.randn(3, 6))]
    path = save_html(figs, tmp_path / "sub" / "figs.html", title="two <figures>")
    page = path.read_text(encoding="utf-8")
    assert page.count('class="plotly-graph-div"') == 2
    assert len(re.findall(r"plotly\.js v\d", page)) == 1  # the library, inlined once
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", page), "nothing may be fetched"
    assert "two &lt;figures&gt;" in page
    with pytest.raises(TypeError, match="plotly Figures"):
        save_html(["not a figure"], tmp_path / "x.html")


def test_viewer_page_embeds_every_head(patterns):
    page = attention_viewer_html(patterns, TOKENS)
    assert page.count('<option value="') == 2 + 3
    embedded = json.loads(re.search(r"var patterns = (.*?);  //", page).group(1))
    # measured 5.0e-6 (values up to 1), bound 1e-5: 2x
    torch.testing.assert_close(torch.tensor(embedded, dtype=torch.float64), patterns.double(), atol=1e-5, rtol=0)
    assert "</script" not in re.search(r"var figure = (.*?);\n", page).group(1)


def test_attention_command_writes_the_page_and_refuses_bad_requests(tmp_path, capsys):
    from glassbox.cli import main
    from glassbox.cli.attention import TINY, build_model, patterns_of

    out = tmp_path / "view.html"
    assert main(["attention", "--model", "random", "--prompt", "a b a", "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.count('<option value="') == TINY["n_layers"] + TINY["n_heads"]
    model = build_model("random", None, seed=0)
    expected = patterns_of(model, model.to_tokens("a b a"))
    embedded = json.loads(re.search(r"var patterns = (.*?);  //", page).group(1))
    # measured 5.0e-6 (values up to 1), bound 1e-5: 2x
    torch.testing.assert_close(torch.tensor(embedded), expected, atol=1e-5, rtol=0)
    assert main(["attention", "--model", "random", "--prompt", "a b c d e f", "--max-tokens", "4", "--out", str(out)]) == 2
    assert "more than --max-tokens=4" in capsys.readouterr().err
    assert main(["attention", "--model", str(tmp_path / "missing"), "--prompt", "a", "--out", str(out)]) == 2
    assert "missing" in capsys.readouterr().err
