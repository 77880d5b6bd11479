"""Transcoders for attribution graphs: ``TranscoderSet`` (per-layer, skip and cross-layer transcoders with
ReLU, JumpReLU or TopK activations, ``set.py``), converters to and from glassbox's ``interp.sae``
transcoders and SAELens's folders (``saelens.py``), and circuit-tracer's on-disk layout (``circuit_tracer.py``).
"""

from .saelens import from_saes, load_saelens_set, save_saelens_set, to_saes
from .set import ACTIVATIONS, TranscoderSet

__all__ = ["ACTIVATIONS", "TranscoderSet", "from_saes", "load_saelens_set", "save_saelens_set", "to_saes"]
