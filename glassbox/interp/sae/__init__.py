"""Sparse autoencoders and transcoders: architectures, SAELens's on-disk format, splicing into a model,
features in the analysis tools, and training."""

from .base import SAE, SAE_HOOKS, StandardSAE
from .config import SAEConfig
from .splice import acts_to_saes, add_sae, remove_sae, reset_saes, with_saes

__all__ = ["SAE", "SAEConfig", "SAE_HOOKS", "StandardSAE", "acts_to_saes", "add_sae", "remove_sae", "reset_saes",
           "with_saes"]
