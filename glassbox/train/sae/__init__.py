"""Training sparse autoencoders on a glassbox model's activations: SAELens's recipe (TopK + AuxK, or
ReLU + decoder-norm-weighted L1 with dead-feature resampling), a shuffling activation buffer over
local text, checkpoints and bit-for-bit resume on the CPU, and the SAE saved in SAELens's format.

``train_sae`` (``api.py``) is the entry point; ``SAETrainer`` and ``SAETrainConfig`` (``trainer.py``)
the loop; ``ActivationStream`` (``stream.py``) the data; ``losses.py`` and ``dead.py`` the objective.
"""

from .api import train_sae
from .checkpoint import load_sae_checkpoint, save_final, save_sae_checkpoint
from .dead import DeadFeatures, resample_dead
from .losses import aux_k_acts, batch_metrics, fold_decoder_norms, topk_relu, training_step_losses
from .stream import ActivationStream, special_token_ids
from .trainer import SAETrainConfig, SAETrainer

__all__ = ["ActivationStream", "DeadFeatures", "SAETrainConfig", "SAETrainer", "aux_k_acts", "batch_metrics",
           "fold_decoder_norms", "load_sae_checkpoint", "resample_dead", "save_final", "save_sae_checkpoint",
           "special_token_ids", "topk_relu", "train_sae", "training_step_losses"]
