"""Transcoders for attribution graphs: ``TranscoderSet`` (per-layer, skip and cross-layer transcoders with
ReLU, JumpReLU or TopK activations, ``set.py``), converters to and from glassbox's ``interp.sae``
transcoders and SAELens's folders (``saelens.py``), and circuit-tracer's on-disk layout (``circuit_tracer.py``).
"""

from .circuit_tracer import load_circuit_tracer, save_circuit_tracer
from .saelens import from_saes, load_saelens_set, save_saelens_set, to_saes
from .seeded import seeded_set
from .set import ACTIVATIONS, TranscoderSet

__all__ = ["ACTIVATIONS", "TranscoderSet", "from_saes", "load_circuit_tracer", "load_saelens_set", "save_circuit_tracer",
           "save_saelens_set", "seeded_set", "to_saes"]
