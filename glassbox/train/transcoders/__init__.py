"""Training transcoder sets (per-layer, skip, cross-layer; TopK or ReLU + L1) on a glassbox model's paired
activations over local text, with the SAE trainer's stream, schedules, checkpoints and bit-for-bit resume;
the set saved in circuit-tracer's layout. ``train_transcoders`` (``api.py``) is the entry point."""

from .api import train_transcoders
from .config import TranscoderTrainConfig
from .stream import PairedStream
from .trainer import TranscoderTrainer, decoder_norms, fold_decoder_norms, new_set, training_losses

__all__ = ["PairedStream", "TranscoderTrainConfig", "TranscoderTrainer", "decoder_norms", "fold_decoder_norms",
           "new_set", "train_transcoders", "training_losses"]
