"""Offline stand-in for neel_plotly (the demo runner's; the real one is installed from a git
repository): imshow / line / scatter of a tensor with plotly.express, shown with the notebook's
renderer, each returning nothing as the original's plotting helpers do."""

import plotly.express as px


def _np(tensor):
    return tensor.detach().cpu().numpy() if hasattr(tensor, "detach") else tensor


def imshow(tensor, renderer=None, xaxis="", yaxis="", **kwargs):
    px.imshow(_np(tensor), color_continuous_midpoint=0.0, color_continuous_scale="RdBu",
              labels={"x": xaxis, "y": yaxis}, **kwargs).show(renderer)


def line(tensor, renderer=None, xaxis="", yaxis="", **kwargs):
    px.line(_np(tensor), labels={"x": xaxis, "y": yaxis}, **kwargs).show(renderer)


def scatter(x, y, renderer=None, xaxis="", yaxis="", caxis="", **kwargs):
    px.scatter(x=_np(x), y=_np(y), labels={"x": xaxis, "y": yaxis, "color": caxis}, **kwargs).show(renderer)
