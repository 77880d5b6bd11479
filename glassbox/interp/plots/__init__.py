"""Plotly figures for attention patterns and analysis results, and offline HTML export.

plotly is imported on first use, never when glassbox is imported. Every function returns a
``plotly.graph_objects.Figure`` (or a page string) and never calls ``show``. ``vis`` (imported as
``glassbox.interp.plots.vis``) holds CircuitsVis-style views in plain HTML, with no plotly.
"""

from .attention import attention_grid, attention_pattern, attention_selector
from .features import feature_dashboard, feature_logit_effects, feature_summaries
from .graph import circuit_page, circuit_plot
from .html import attention_viewer_html, save_html
from .results import attribution_bar, logit_lens_plot, patching_heatmap

__all__ = ["attention_grid", "attention_pattern", "attention_selector", "attention_viewer_html", "attribution_bar",
           "circuit_page", "circuit_plot", "feature_dashboard", "feature_logit_effects", "feature_summaries",
           "logit_lens_plot", "patching_heatmap", "save_html"]
