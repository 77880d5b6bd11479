"""Offline CircuitsVis-style views: attention heads, coloured tokens and top-k tokens, in plain HTML.

The functions take CircuitsVis's arguments, in its order and shapes, so a TransformerLens notebook
switches by changing its import (``import glassbox.interp.plots.vis as cv``):

- ``attention_heads(attention, tokens, attention_head_names=None, max_value=None, min_value=None,
  negative_color=None, positive_color=None, mask_upper_tri=None)``: attention [head dest src] (or one
  head [dest src]); a thumbnail per head, a click (or Enter on it) shows that head full size, each
  cell's value on hover, and clicking a destination token colours the token strip by its attention;
- ``attention_patterns(tokens, attention)``: the same view, heads named "Head 0", "Head 1", ...;
- ``attention_pattern(tokens, attention, ...)``: one head [dest src];
- ``colored_tokens(tokens, values, min_value=None, max_value=None, negative_color=None,
  positive_color=None)``: each token's background by its value;
- ``topk_tokens(tokens, activations, max_k=10, first_dimension_name="Layer",
  third_dimension_name="Neuron")``: per sample, activations [first dim, n_tokens, neurons]; a table of
  the top and bottom ``k`` tokens of each neuron, with selectors for the sample, the first dimension,
  the neurons shown and k.

Each returns a ``Rendered``: ``_repr_html_`` draws it inline in Jupyter, ``str()`` is the HTML fragment,
``.save(path)`` writes a whole page (crash-safe, through glassbox.fs). The fragment holds its data and
a small script and loads nothing: no CDN, no fonts, no network (CircuitsVis fetches its code from a CDN
and draws nothing offline). Fragments get unique ids, so several in one notebook or page do not clash.

Values may come as tensors (any device and dtype), numpy arrays or nested lists; they are read as
float64 on the CPU and must be finite (a NaN or inf is refused, naming where). Colours default to
blue for positive and red for negative values; a value's colour is its share of ``max_value`` (or of
``min_value`` below zero). Tokens are text, never markup. Footgun: the page holds every value, so a
long context is heads x dest x src numbers; slice first.
"""

import html
import json
import re
import uuid
from pathlib import Path
from typing import List, Optional, Sequence, Union

import torch

from ...fs import write_text
from .vis_script import SCRIPT

POSITIVE, NEGATIVE = "#1f5fb4", "#c0392b"
_COLOUR = re.compile(r"^[#A-Za-z0-9(),.%\s-]{1,64}$")  # a CSS colour, with nothing that could end a style


class Rendered:
    """An HTML view: shown inline by Jupyter (``_repr_html_``), its fragment as ``str()``, saved by ``save``."""

    def __init__(self, kind: str, fragment: str, summary: str):
        self.kind, self._fragment, self._summary = kind, fragment, summary

    def _repr_html_(self) -> str:
        return self._fragment

    def __str__(self) -> str:
        return self._fragment

    def __repr__(self) -> str:
        return f"<glassbox {self.kind}: {self._summary}>"

    def save(self, path: Union[str, Path], title: Optional[str] = None) -> Path:
        """Write a whole offline page holding this view to ``path`` (written whole or not at all)."""
        title = html.escape(title or self.kind)
        page = (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{title}</title>\n</head>\n'
                f'<body style="font-family: sans-serif; margin: 1.5em">\n{self._fragment}\n</body>\n</html>\n')
        return write_text(path, page)


def _values(value, name: str, ndims: Sequence[int]) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().to("cpu", torch.float64)
    else:
        try:
            tensor = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(f"{name} must be a tensor, a numpy array or nested lists of numbers: {error}") from None
    if tensor.ndim not in ndims:
        want = " or ".join(f"{n} dimensions" for n in ndims)
        raise ValueError(f"{name} must have {want}, got shape {tuple(tensor.shape)}")
    bad = ~torch.isfinite(tensor)
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}{list(where)} is {tensor[where].item()}; every value must be finite")
    return tensor


def _tokens(tokens, n: int, name: str = "tokens") -> List[str]:
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise TypeError(f"{name} must be a list of strings (e.g. model.to_str_tokens(text)), got {type(tokens).__name__}")
    for i, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TypeError(f"{name}[{i}] is {type(token).__name__} {token!r}; every token must be a string")
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} entries but the values have {n} positions")
    return list(tokens)


def _colour(value: Optional[str], default: str, name: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str) or not _COLOUR.match(value):
        raise ValueError(f"{name} must be a CSS colour such as '#1f5fb4', 'blue' or 'rgb(0, 0, 255)', got {value!r}")
    return value


def _range(values: torch.Tensor, min_value, max_value, default_max: Optional[float] = None) -> tuple:
    """(min, max) of the colour scale: the given ones, else the values' extremes (0 kept inside)."""
    for name, v in (("min_value", min_value), ("max_value", max_value)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf")):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    high = float(max_value) if max_value is not None else max(default_max or 0.0, float(values.max()), 0.0)
    low = float(min_value) if min_value is not None else min(float(values.min()), 0.0)
    if low > high:
        raise ValueError(f"min_value {low} is above max_value {high}")
    return low, high


def _fragment(kind: str, data: dict) -> str:
    element = f"gb-{kind}-{uuid.uuid4().hex[:12]}"
    payload = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return (f'<div class="gb-vis gb-{kind}" id="{element}" data-kind="{kind}"></div>\n'
            f'<script type="application/json" id="{element}-data">{payload}</script>\n'
            f'<script type="text/javascript">{SCRIPT}\nglassboxVis("{element}");</script>')


def attention_heads(attention, tokens: Sequence, attention_head_names: Optional[Sequence] = None,
                    max_value: Optional[float] = None, min_value: Optional[float] = None,
                    negative_color: Optional[str] = None, positive_color: Optional[str] = None,
                    mask_upper_tri: Optional[bool] = None) -> Rendered:
    """Attention from destination to source tokens for a group of heads, [head dest src] (or [dest src]):
    a thumbnail per head, the selected one full size (see the module docstring)."""
    values = _values(attention, "attention", (2, 3))
    if values.ndim == 2:
        values = values[None]
    n_heads, n_dest, n_src = values.shape
    if n_dest != n_src:
        raise ValueError(f"attention is [head dest src] with dest = src = len(tokens); got shape {tuple(values.shape)}")
    tokens = _tokens(tokens, n_src)
    if attention_head_names is None:
        names = [f"Head {i}" for i in range(n_heads)]
    else:
        names = _tokens(attention_head_names, n_heads, "attention_head_names")
    low, high = _range(values, min_value, max_value, default_max=1.0)
    if mask_upper_tri is not None and not isinstance(mask_upper_tri, bool):
        raise TypeError(f"mask_upper_tri must be True, False or None, got {mask_upper_tri!r}")
    data = dict(tokens=tokens, names=names, attention=values.round(decimals=6).tolist(), min=low, max=high,
                positive=_colour(positive_color, POSITIVE, "positive_color"),
                negative=_colour(negative_color, NEGATIVE, "negative_color"), mask=bool(mask_upper_tri))
    return Rendered("attention_heads", _fragment("attention", data),
                    f"{n_heads} head{'s' if n_heads != 1 else ''} x {n_dest} tokens")


def attention_patterns(tokens: Sequence, attention) -> Rendered:
    """CircuitsVis's ``attention_patterns(tokens, attention)``: attention [head dest src], as ``attention_heads``."""
    return attention_heads(attention, tokens)


def attention_pattern(tokens: Sequence, attention, max_value: Optional[float] = None,
                      min_value: Optional[float] = None, negative_color: Optional[str] = None,
                      show_axis_labels: Optional[bool] = None, positive_color: Optional[str] = None) -> Rendered:
    """One head's attention [dest src] as a heatmap (``show_axis_labels`` is accepted; the tokens are
    always shown)."""
    values = _values(attention, "attention", (2,))
    return attention_heads(values, tokens, ["attention"], max_value, min_value, negative_color, positive_color)


def colored_tokens(tokens: Sequence, values, min_value: Optional[float] = None, max_value: Optional[float] = None,
                   negative_color: Optional[str] = None, positive_color: Optional[str] = None) -> Rendered:
    """Each token with its background coloured by its value [n_tokens]; the value on hover."""
    numbers = _values(values, "values", (1,))
    tokens = _tokens(tokens, numbers.shape[0])
    low, high = _range(numbers, min_value, max_value)
    data = dict(tokens=tokens, values=numbers.round(decimals=6).tolist(), min=low, max=high,
                positive=_colour(positive_color, POSITIVE, "positive_color"),
                negative=_colour(negative_color, NEGATIVE, "negative_color"))
    return Rendered("colored_tokens", _fragment("tokens", data), f"{len(tokens)} tokens")


def topk_tokens(tokens: Sequence, activations, max_k: int = 10, first_dimension_name: str = "Layer",
                third_dimension_name: str = "Neuron") -> Rendered:
    """For each sample (``tokens[i]``, ``activations[i]`` [first dim, n_tokens, neurons]) the top and
    bottom ``max_k`` tokens of every neuron, as a table with selectors."""
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
        raise ValueError(f"max_k must be a positive int, got {max_k!r}")
    for name, value in (("first_dimension_name", first_dimension_name), ("third_dimension_name", third_dimension_name)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if isinstance(tokens, str) or not isinstance(tokens, Sequence) or not tokens:
        raise TypeError("tokens must be a non-empty list with one list of tokens per sample")
    if isinstance(activations, torch.Tensor) and activations.ndim == 4:
        activations = list(activations)
    if not isinstance(activations, Sequence) or len(activations) != len(tokens):
        n = len(activations) if isinstance(activations, Sequence) else type(activations).__name__
        raise ValueError(f"activations must be a list with one array per sample ({len(tokens)}), got {n}")
    samples = []
    shape = None
    for i, (sample_tokens, acts) in enumerate(zip(tokens, activations)):
        acts = _values(acts, f"activations[{i}]", (3,))
        if shape is not None and (acts.shape[0], acts.shape[2]) != shape:
            raise ValueError(f"activations[{i}] has shape {tuple(acts.shape)}; every sample must have "
                             f"[{shape[0]} n_tokens {shape[1]}] like activations[0]")
        shape = (acts.shape[0], acts.shape[2])
        sample_tokens = _tokens(sample_tokens, acts.shape[1], f"tokens[{i}]")
        k = min(max_k, acts.shape[1])
        top, bottom = acts.topk(k, dim=1), acts.topk(k, dim=1, largest=False)
        samples.append(dict(tokens=sample_tokens, top_values=top.values.round(decimals=6).tolist(),
                            top_index=top.indices.tolist(), bottom_values=bottom.values.round(decimals=6).tolist(),
                            bottom_index=bottom.indices.tolist()))
    biggest = max(max(abs(v) for layer in s["top_values"] + s["bottom_values"] for row in layer for v in row)
                  for s in samples) or 1.0
    data = dict(samples=samples, first=first_dimension_name, third=third_dimension_name, max_k=max_k,
                scale=biggest, positive=POSITIVE, negative=NEGATIVE)
    return Rendered("topk_tokens", _fragment("topk", data),
                    f"{len(samples)} sample{'s' if len(samples) != 1 else ''}, {shape[0]} {first_dimension_name.lower()}"
                    f"{'s' if shape[0] != 1 else ''} x {shape[1]} {third_dimension_name.lower()}s")

