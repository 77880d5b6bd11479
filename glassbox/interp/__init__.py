"""Interpretability on a hooked model: the activation cache and its analysis, head detection, circuits
(composition scores, singular directions), prompt reports and small evaluations."""

from ..models.generate import get_last_token_logits, last_token_positions
from .act_names import act_name
from .activation_cache import ActivationCache
from .cache import CacheMemoryError, CacheSizeWarning, cache_size, run_with_cache
from .composition import all_composition_scores, composition_scores
from .decomposition import accumulated_bias, get_full_resid_decomposition
from .evals import ioi_logit_diffs, repeated_tokens_loss
from .factored_matrix import FactoredMatrix
from .heads import (HEAD_KINDS, detect_head, detect_head_matching, detection_pattern, induction_score,
                    induction_tokens, match_scores)
from .ioi_data import IOIDataset
from .neurons import get_neuron_results, stack_neuron_results
from .prompts import format_prompt_report, prompt_report
from .resid import (accumulated_resid, apply_ln_to_stack, compute_head_results, decompose_resid, logit_attrs,
                    stack_head_results)
from .svd_interpreter import singular_vocab_directions

__all__ = [
    "ActivationCache", "CacheMemoryError", "CacheSizeWarning", "FactoredMatrix", "HEAD_KINDS", "IOIDataset",
    "accumulated_bias", "accumulated_resid", "act_name", "all_composition_scores", "apply_ln_to_stack", "cache_size",
    "composition_scores", "compute_head_results", "decompose_resid", "detect_head", "detect_head_matching",
    "detection_pattern", "format_prompt_report", "get_full_resid_decomposition", "get_last_token_logits",
    "get_neuron_results", "induction_score", "induction_tokens", "ioi_logit_diffs", "last_token_positions",
    "logit_attrs", "match_scores", "prompt_report", "repeated_tokens_loss", "run_with_cache",
    "singular_vocab_directions", "stack_head_results", "stack_neuron_results",
]

# Patching, plots (plotly is imported only when a plot is made), SAEs and attribution.
from . import attribution, patching, plots, sae  # noqa: E402
from .patching import LogitDiff, Normalized, PatchResult, activation_patch, path_patch  # noqa: E402
from .plots import save_html  # noqa: E402

__all__ += ["LogitDiff", "Normalized", "PatchResult", "activation_patch", "attribution", "patching", "path_patch",
            "plots", "sae", "save_html"]
