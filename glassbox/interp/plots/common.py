"""Helpers shared by the plots: the lazy plotly import, tensor -> list, and index-based tick labels.

Token axes are plotted by index (0, 1, 2, ...) with the tokens as tick text, never with the tokens
as categories: plotly merges equal category names, so a repeated token would collapse two rows into
one. Hover text names both the token and its index.

Labels are text: plotly reads a subset of HTML (``<b>``, ``<br>``, ``<a href>``, entities) in tick
labels, hover text and titles, so every token or label string passes through ``escape`` before it
reaches a figure, and a token ``<b>x</b>`` is shown as written.
"""

import html
from typing import Optional, Sequence

import torch
from torch import Tensor


def go():
    """``plotly.graph_objects``, imported on first use so that importing glassbox never needs plotly."""
    try:
        import plotly.graph_objects as graph_objects
    except ImportError as err:  # pragma: no cover - plotly is a dependency, but say so if it is missing
        raise ImportError("glassbox.interp.plots needs plotly: pip install plotly") from err
    return graph_objects


def make_subplots(**kwargs):
    from plotly.subplots import make_subplots as subplots

    return subplots(**kwargs)


def to_list(values: Tensor, digits: Optional[int] = None) -> list:
    """Nested Python floats (NaN kept), from any device and dtype; rounded when ``digits`` is given."""
    values = values.detach().to("cpu", torch.float64)
    if digits is not None:
        values = values.round(decimals=digits)
    return values.tolist()


def index_labels(labels: Optional[Sequence], n: int, what: str) -> list:
    """``n`` tick labels: the given ones (checked against n) or the indices."""
    if labels is None:
        return [str(i) for i in range(n)]
    labels = [str(label) for label in labels]
    if len(labels) != n:
        raise ValueError(f"{what} has {n} entries but {len(labels)} labels were given")
    return labels


def index_axis(labels: list, title: str = "") -> dict:
    """Layout for an axis plotted by index whose ticks read ``labels`` (repeats stay separate rows)."""
    return dict(tickmode="array", tickvals=list(range(len(labels))), ticktext=[escape(shown(l)) for l in labels],
                title=title)


def escape(text: str) -> str:
    """A string as plotly text: &, < and > become entities, which plotly shows as the characters."""
    return html.escape(text, quote=False)


def shown(label: str) -> str:
    """A token as a tick label: whitespace made visible, so ' the' and 'the' differ on screen."""
    return label.replace(" ", "\u00b7").replace("\n", "\\n") if label.strip() != label or "\n" in label else label
