"""Activation patching and path patching: batched sweeps, metrics and labelled results.

``activation_patch`` is the one engine; ``sweeps.py`` names the common sweeps (TransformerLens's
meanings); ``path.py`` restricts a patch to chosen paths. Metrics return one value per prompt;
a ``VariantMetric`` (TransformerLens's contract) one value per patched variant.
Every sweep honours the user's forward hooks (on the model, or ``fwd_hooks=``) as a
one-patch-per-forward loop under those hooks would (``user_hooks.py``).
"""

from .engine import ACTIVATIONS, activation_patch
from .metrics import LogitDiff, Normalized, PositionMetric, TargetLoss, TargetProb, VariantMetric
from .path import path_patch, path_patch_heads
from .result import PatchResult
from .sweeps import (patch_attn_out, patch_block_every, patch_head_every, patch_head_every_by_pos, patch_head_k,
                     patch_head_k_by_pos, patch_head_pattern, patch_head_pattern_by_pos, patch_head_q,
                     patch_head_q_by_pos, patch_head_v, patch_head_v_by_pos, patch_head_z, patch_head_z_by_pos,
                     patch_mlp_out, patch_resid_mid, patch_resid_post, patch_resid_pre)

__all__ = [
    "ACTIVATIONS", "LogitDiff", "Normalized", "PatchResult", "PositionMetric", "TargetLoss", "TargetProb",
    "VariantMetric",
    "activation_patch", "path_patch", "path_patch_heads", "patch_attn_out", "patch_block_every",
    "patch_head_every", "patch_head_every_by_pos", "patch_head_k", "patch_head_k_by_pos", "patch_head_pattern",
    "patch_head_pattern_by_pos", "patch_head_q", "patch_head_q_by_pos", "patch_head_v", "patch_head_v_by_pos",
    "patch_head_z", "patch_head_z_by_pos", "patch_mlp_out", "patch_resid_mid", "patch_resid_post",
    "patch_resid_pre",
]
