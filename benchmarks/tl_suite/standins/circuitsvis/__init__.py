"""Offline stand-in for circuitsvis (the demo runner's, not glassbox's): the real package renders its
views with JavaScript fetched from the web. Each function checks its arguments' shapes as the real
one needs them and returns an object whose HTML names the view, so a cell that draws one passes or
fails on the data it was given."""

from . import attention, examples  # noqa: F401
