"""Gradient attribution and circuit discovery on the hooked model: attribution patching over nodes
(AtP, AtP*), edge attribution (EAP, EAP-IG), circuits evaluated exactly by patching, and their
faithfulness.

- ``attribution_patch`` / ``atp_*``: the first-order estimate of each exact patching sweep
  (``glassbox.interp.patching``), same axes, labels and metrics; ``attribution_patch_star``: AtP*.
- ``eap``: a score for every edge sender -> receiver input (``edges.py`` names them), as a ``Graph``.
- ``evaluate_circuit``: the metric of circuits (edge masks) run exactly, every edge outside
  patched to its corrupted value; ``faithfulness_curve``: MIB's faithfulness, CPR and CMD;
  ``prune_circuit``: greedy (ACDC-style) pruning on the exact evaluator.
"""

from .atp import attribution_patch
from .atp_star import attribution_patch_star
from .atp_sweeps import (atp_attn_out, atp_block_every, atp_head_every, atp_head_every_by_pos, atp_head_k,
                         atp_head_k_by_pos, atp_head_pattern, atp_head_pattern_by_pos, atp_head_q, atp_head_q_by_pos,
                         atp_head_v, atp_head_v_by_pos, atp_head_z, atp_head_z_by_pos, atp_mlp_out, atp_neurons,
                         atp_neurons_by_pos, atp_resid_mid, atp_resid_post, atp_resid_pre)
from .circuit import evaluate_circuit
from .eap import METHODS, eap
from .edges import edge_exists, receivers, senders
from .faithfulness import FaithfulnessCurve, faithfulness, faithfulness_curve
from .graph import Graph
from .nodes import ATP_ACTIVATIONS
from .prune import prune_circuit

__all__ = [
    "ATP_ACTIVATIONS", "FaithfulnessCurve", "Graph", "METHODS", "atp_attn_out", "atp_block_every", "atp_head_every",
    "atp_head_every_by_pos", "atp_head_k", "atp_head_k_by_pos", "atp_head_pattern", "atp_head_pattern_by_pos",
    "atp_head_q", "atp_head_q_by_pos", "atp_head_v", "atp_head_v_by_pos", "atp_head_z", "atp_head_z_by_pos",
    "atp_mlp_out", "atp_neurons", "atp_neurons_by_pos", "atp_resid_mid", "atp_resid_post", "atp_resid_pre",
    "attribution_patch", "attribution_patch_star", "eap", "edge_exists", "evaluate_circuit", "faithfulness",
    "faithfulness_curve", "prune_circuit", "receivers", "senders",
]
