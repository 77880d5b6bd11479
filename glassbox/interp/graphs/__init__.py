"""Attribution graphs over transcoder features (circuit tracing): the local replacement model of a prompt
(``replacement.py``), the exact graph of direct effects (``attribute.py``, ``graph.py``) and pruning by
influence (``prune.py``)."""

from .attribute import attribute, estimate_bytes, select_logits
from .graph import AttributionGraph
from .replacement import ReplacementRun

__all__ = ["AttributionGraph", "ReplacementRun", "attribute", "estimate_bytes", "select_logits"]
