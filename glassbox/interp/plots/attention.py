"""Attention-pattern figures: one head, a grid of heads, and a layer/head selector for a whole model.

Query tokens run down the y axis (first token at the top), key tokens along the x axis; both are
plotted by index with the string tokens as tick labels, so repeated tokens stay distinct. Hover
shows the query and key tokens with their positions and the probability. Tokens are text, never
markup (see ``common.escape``). Every function returns a
``plotly.graph_objects.Figure`` and never shows it.

Footgun: a figure holds every value it shows; a selector over a whole model at long context is
n_layers x n_heads x pos^2 numbers. Keep prompts short, or pick heads.
"""

from typing import Optional, Sequence

from jaxtyping import Float
from torch import Tensor

from .common import escape, go, index_axis, index_labels, make_subplots, shown, to_list

COLOURS = "Blues"  # probabilities: sequential, 0 to 1


def hover_text(tokens: list) -> list:
    """[query][key] hover strings naming both tokens and positions."""
    return [[f"query {q} {escape(repr(shown(tq)))}<br>key {k} {escape(repr(shown(tk)))}" for k, tk in enumerate(tokens)]
            for q, tq in enumerate(tokens)]


def heatmap_trace(pattern: Tensor, tokens: list, **kwargs):
    return go().Heatmap(z=to_list(pattern, 5), text=hover_text(tokens), zmin=0.0, zmax=1.0,
                        hovertemplate="%{text}<br>p = %{z:.4f}<extra></extra>", colorscale=COLOURS, **kwargs)


def check_square(pattern: Tensor, tokens: Optional[Sequence]) -> list:
    if pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"an attention pattern is [... query_pos key_pos] with equal lengths, "
                         f"got shape {tuple(pattern.shape)}")
    return index_labels(tokens, pattern.shape[-1], "the pattern's positions")


def attention_pattern(pattern: Float[Tensor, "query_pos key_pos"], tokens: Optional[Sequence] = None,
                      title: str = "attention pattern"):
    """One head's pattern [query_pos key_pos] as a heatmap."""
    if pattern.ndim != 2:
        raise ValueError(f"attention_pattern takes one head [query_pos key_pos], got shape {tuple(pattern.shape)}")
    labels = check_square(pattern, tokens)
    fig = go().Figure(heatmap_trace(pattern, labels))
    fig.update_layout(title=title, xaxis=index_axis(labels, "key"), yaxis=dict(index_axis(labels, "query"),
                      autorange="reversed"))
    return fig


def attention_grid(patterns: Float[Tensor, "head query_pos key_pos"], tokens: Optional[Sequence] = None,
                   head_labels: Optional[Sequence] = None, cols: int = 4, title: str = "attention patterns"):
    """Several heads' patterns [head query_pos key_pos], one small heatmap each, sharing a colour bar."""
    if patterns.ndim != 3:
        raise ValueError(f"attention_grid takes [head query_pos key_pos], got shape {tuple(patterns.shape)}")
    labels = check_square(patterns, tokens)
    heads = index_labels(head_labels, patterns.shape[0], "heads")
    if not (isinstance(cols, int) and cols > 0):
        raise ValueError(f"cols must be a positive int, got {cols!r}")
    cols = min(cols, len(heads))
    rows = -(-len(heads) // cols)
    # Shared axes: token labels only on the outer edges, and zooming one panel zooms them all.
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {escape(h)}" for h in heads], shared_xaxes=True,
                        shared_yaxes=True, horizontal_spacing=0.02, vertical_spacing=0.3 / rows)
    for i, head in enumerate(heads):
        fig.add_trace(heatmap_trace(patterns[i], labels, coloraxis="coloraxis", name=f"head {head}"),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(**index_axis(labels))
    fig.update_yaxes(**index_axis(labels), autorange="reversed")
    fig.update_layout(title=title, coloraxis=dict(colorscale=COLOURS, cmin=0.0, cmax=1.0),
                      height=rows * min(600, max(260, 10 * len(labels))) + 80)
    return fig


def attention_selector(patterns: Float[Tensor, "layer head query_pos key_pos"], tokens: Optional[Sequence] = None,
                       title: str = "attention patterns", initial: tuple = (0, 0)):
    """Every layer's and head's pattern [layer head query_pos key_pos] in one figure, with a dropdown
    choosing the layer and head shown; it opens on ``initial`` (layer, head), e.g. the head a caption names."""
    if patterns.ndim != 4:
        raise ValueError(f"attention_selector takes [layer head query_pos key_pos], got shape {tuple(patterns.shape)}")
    labels = check_square(patterns, tokens)
    n_layers, n_heads = patterns.shape[:2]
    if (not isinstance(initial, tuple) or len(initial) != 2 or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                        for i in initial)
            or not (0 <= initial[0] < n_layers and 0 <= initial[1] < n_heads)):
        raise ValueError(f"initial must be (layer, head) with layer in [0, {n_layers}) and head in [0, {n_heads}), "
                         f"got {initial!r}")
    first_layer, first_head = initial
    values = to_list(patterns, 5)
    fig = go().Figure(heatmap_trace(patterns[first_layer, first_head], labels))
    buttons = [dict(label=f"layer {l} head {h}", method="update",
                    args=[{"z": [values[l][h]]}, {"title.text": f"{title}: layer {l}, head {h}"}])
               for l in range(n_layers) for h in range(n_heads)]
    fig.update_layout(title=f"{title}: layer {first_layer}, head {first_head}", xaxis=index_axis(labels, "key"),
                      yaxis=dict(index_axis(labels, "query"), autorange="reversed"),
                      updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.15,
                                        yanchor="top", showactive=True, active=first_layer * n_heads + first_head)])
    return fig
