"""Interpretability on a hooked model: the activation cache and its analysis, head detection."""

from ..models.generate import get_last_token_logits, last_token_positions
from .act_names import act_name
from .activation_cache import ActivationCache
from .cache import CacheMemoryError, CacheSizeWarning, cache_size, run_with_cache
from .factored_matrix import FactoredMatrix
from .heads import HEAD_KINDS, detect_head, detection_pattern, induction_score, induction_tokens
from .resid import (accumulated_resid, apply_ln_to_stack, decompose_resid, logit_attrs,
                    stack_head_results)

__all__ = [
    "ActivationCache", "CacheMemoryError", "CacheSizeWarning", "FactoredMatrix", "HEAD_KINDS", "accumulated_resid",
    "act_name", "apply_ln_to_stack", "cache_size", "decompose_resid", "detect_head", "detection_pattern",
    "get_last_token_logits", "induction_score", "induction_tokens", "last_token_positions", "logit_attrs",
    "run_with_cache", "stack_head_results",
]

# Patching and plots (plotly is imported only when a plot is made).
from . import patching, plots  # noqa: E402
from .patching import LogitDiff, Normalized, PatchResult, activation_patch, path_patch  # noqa: E402
from .plots import save_html  # noqa: E402

__all__ += ["LogitDiff", "Normalized", "PatchResult", "activation_patch", "patching", "path_patch", "plots",
            "save_html"]
