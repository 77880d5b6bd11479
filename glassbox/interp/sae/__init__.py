"""Sparse autoencoders and transcoders: architectures, SAELens's on-disk format, splicing into a model,
features in the analysis tools (decomposition, logit attribution, batched feature patching) and
SAELens-style evaluations. Training is in ``glassbox.train.sae``."""

from .architectures import (ARCHITECTURES, TRANSCODERS, BatchTopKSAE, GatedSAE, JumpReLUSAE, JumpReLUSkipTranscoder,
                            JumpReLUTranscoder, SkipTranscoder, TopKSAE, Transcoder, make_sae, register_architecture,
                            sae_class)
from .base import SAE, SAE_HOOKS, StandardSAE
from .config import NORMALIZATIONS, SAEConfig
from .evals import evaluate_sae
from .feature_patching import feature_ablate, feature_patch
from .features import Decomposition, decompose, feature_acts, feature_logit_attrs, top_features
from .format import load_sae, load_sparsity, save_sae
from .splice import (acts_to_saes, add_sae, remove_sae, reset_saes, run_with_cache_with_saes, run_with_hooks_with_saes,
                     run_with_saes, with_saes)

__all__ = [
    "ARCHITECTURES", "BatchTopKSAE", "Decomposition", "GatedSAE", "JumpReLUSAE", "JumpReLUSkipTranscoder",
    "JumpReLUTranscoder", "NORMALIZATIONS", "SAE", "SAEConfig", "SAE_HOOKS", "SkipTranscoder", "StandardSAE",
    "TRANSCODERS", "TopKSAE", "Transcoder", "acts_to_saes", "add_sae", "decompose", "evaluate_sae", "feature_ablate",
    "feature_acts", "feature_logit_attrs", "feature_patch", "load_sae", "load_sparsity", "make_sae",
    "register_architecture", "remove_sae", "reset_saes", "run_with_cache_with_saes", "run_with_hooks_with_saes",
    "run_with_saes", "sae_class", "save_sae", "top_features", "with_saes",
]
