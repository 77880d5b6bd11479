"""Transcoders for attribution graphs: ``TranscoderSet`` (per-layer, skip and cross-layer transcoders with
ReLU, JumpReLU or TopK activations, ``set.py``); converters to and from glassbox's ``interp.sae``
transcoders and SAELens's folders (``saelens.py``); circuit-tracer's on-disk layout (``circuit_tracer.py``);
``load_transcoders`` for either format or a shipped set's name (``shipped.py``); held-out evals
(``evals.py``); seeded random sets for tests and benchmarks (``seeded.py``). Training is in
``glassbox.train.transcoders``.
"""

from .circuit_tracer import load_circuit_tracer, save_circuit_tracer
from .evals import evaluate_transcoders
from .saelens import from_saes, load_saelens_set, save_saelens_set, to_saes
from .seeded import seeded_set
from .set import ACTIVATIONS, TranscoderSet
from .shipped import load_transcoders, shipped_transcoders

__all__ = ["ACTIVATIONS", "TranscoderSet", "evaluate_transcoders", "from_saes", "load_circuit_tracer",
           "load_saelens_set", "load_transcoders", "save_circuit_tracer", "save_saelens_set", "seeded_set",
           "shipped_transcoders", "to_saes"]
