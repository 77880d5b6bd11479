"""Figures of analysis results: patching heatmaps, logit-lens lines and attribution bars.

Patching heatmaps use a diverging colour scale centred on zero (red below, blue above) so the sign of
an effect reads at a glance; a ``PatchResult`` brings its own axis names and labels (layer rows,
position or head columns; position ticks are the string tokens, repeated tokens kept apart). A
result with a leading ``component`` axis (``patch_block_every`` ...) becomes one panel per component
sharing one colour scale. Labels and tokens are text, never markup (see ``common.escape``). Every
function returns a ``plotly.graph_objects.Figure``; none shows it.
"""

from typing import Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor

from ..patching.result import PatchResult
from .common import escape, go, index_axis, index_labels, make_subplots, shown, to_list

DIVERGING = "RdBu"


def patching_heatmap(result: Union[PatchResult, Tensor], title: Optional[str] = None,
                     x_labels: Optional[Sequence] = None, y_labels: Optional[Sequence] = None):
    """A [row col] result (e.g. layer x pos, layer x head) as a heatmap centred on zero; a
    [component row col] result as one panel per component."""
    if isinstance(result, Tensor):
        if result.ndim not in (2, 3):
            raise ValueError(f"patching_heatmap draws [row col] or [component row col], got shape {tuple(result.shape)}")
        result = PatchResult(result, ("component", "row", "column")[3 - result.ndim:])
    values = result.values.detach()
    if values.ndim == 3 and result.axes[0] == "component":
        panels = [result.select("component", i) for i in range(values.shape[0])]
    elif values.ndim == 2:
        panels = [result]
    else:
        raise ValueError(f"patching_heatmap draws [row col] or [component row col] results, got axes "
                         f"{result.axes}; use result.select(axis, index) to pick a slice")
    finite = values[torch.isfinite(values)]
    bound = float(finite.abs().max()) if finite.numel() else 1.0
    bound = bound or 1.0
    titles = [escape(p.name) for p in panels] if len(panels) > 1 else None
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=titles,
                        vertical_spacing=0.12 / max(1, len(panels) - 1) if len(panels) > 1 else 0.0)
    for i, panel in enumerate(panels, start=1):
        y_axis, x_axis = panel.axes
        rows = index_labels(y_labels if y_labels is not None else panel.labels.get(y_axis), panel.values.shape[0], y_axis)
        cols = index_labels(x_labels if x_labels is not None else panel.labels.get(x_axis), panel.values.shape[1], x_axis)
        text = [[escape(f"{y_axis} {r}, {x_axis} {c} {shown(cl)!r}" if x_axis in ("pos", "query_pos", "key_pos")
                        else f"{y_axis} {r}, {x_axis} {cl}") for c, cl in enumerate(cols)] for r in rows]
        fig.add_trace(go().Heatmap(z=to_list(panel.values), text=text, coloraxis="coloraxis",
                                   hovertemplate="%{text}<br>%{z:.4f}<extra></extra>"), row=i, col=1)
        fig.update_xaxes(**index_axis(cols, x_axis), row=i, col=1)
        fig.update_yaxes(**index_axis(rows, y_axis), autorange="reversed", row=i, col=1)
    metric = f" ({result.metric})" if result.metric else ""  # a metric's repr may hold tokens: escaped
    fig.update_layout(title=title if title is not None else escape(f"patching {result.name}{metric}"),
                      coloraxis=dict(colorscale=DIVERGING, cmin=-bound, cmax=bound),  # symmetric: 0 is white
                      height=max(350, 300 * len(panels)))
    return fig


def logit_lens_plot(values: Float[Tensor, "series layer"], layer_labels: Optional[Sequence] = None,
                    series_labels: Optional[Sequence] = None, title: str = "logit lens",
                    y_title: str = "logit"):
    """One line per series (e.g. per answer token) across layers: [series layer], or [layer] for one."""
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2:
        raise ValueError(f"logit_lens_plot takes [layer] or [series layer], got shape {tuple(values.shape)}")
    xs = index_labels(layer_labels, values.shape[1], "layers")
    names = index_labels(series_labels, values.shape[0], "series")
    fig = go().Figure([go().Scatter(x=list(range(len(xs))), y=row, mode="lines+markers", name=escape(name),
                                    text=[escape(x) for x in xs],
                                    hovertemplate="%{text}: %{y:.4f}<extra>" + escape(name) + "</extra>")
                       for row, name in zip(to_list(values), names)])
    fig.update_layout(title=title, xaxis=index_axis(xs, "layer"), yaxis=dict(title=y_title, zeroline=True))
    return fig


def attribution_bar(values: Float[Tensor, "component"], labels: Optional[Sequence] = None,
                    title: str = "attribution", y_title: str = "contribution"):
    """One bar per component (e.g. direct logit attribution of each head), coloured by sign."""
    if values.ndim != 1:
        raise ValueError(f"attribution_bar takes [component], got shape {tuple(values.shape)}")
    names = index_labels(labels, values.shape[0], "components")
    ys = to_list(values)
    colours = ["#2166ac" if y >= 0 else "#b2182b" for y in ys]
    fig = go().Figure(go().Bar(x=list(range(len(names))), y=ys, marker_color=colours, text=[escape(n) for n in names],
                               hovertemplate="%{text}: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, xaxis=index_axis(names, ""), yaxis=dict(title=y_title, zeroline=True))
    return fig
