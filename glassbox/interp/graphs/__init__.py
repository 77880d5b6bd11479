"""Attribution graphs over transcoder features (circuit tracing): the local replacement model of a prompt
(``replacement.py``), the exact graph of direct effects (``attribute.py``, ``graph.py``) and pruning by
influence (``prune.py``)."""

from .attribute import attribute, estimate_bytes, select_logits
from .graph import AttributionGraph
from .replacement import ReplacementRun
from .transcoders import StackedTranscoders, random_transcoders

__all__ = ["AttributionGraph", "ReplacementRun", "StackedTranscoders", "attribute", "estimate_bytes",
           "random_transcoders", "select_logits"]
