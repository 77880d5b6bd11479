"""SAE training checkpoints and the saved SAE.

A checkpoint is a folder written by ``glassbox.train.checkpoint.save_checkpoint`` (crash-safe at
every instant, see there): ``model.safetensors`` (the SAE's state dict, as trained: a TopK SAE's
decoder rows not yet folded to norm 1), ``config.json`` (its ``SAEConfig``) and ``trainer_state.pt``
(plain tensors and containers only, read with ``torch.load(weights_only=True)``). A damaged one
raises ``CheckpointError`` naming the file; nothing in it is ever executed.

``save_final`` writes the trained SAE in SAELens's folder format (``cfg.json`` and
``sae_weights.safetensors``), which SAELens's ``SAE.load_from_disk`` and glassbox's ``load_sae`` read.
"""

from pathlib import Path
from typing import Union

from ...interp.sae.config import SAEConfig
from ..checkpoint import read_checkpoint, save_checkpoint

STATE_KEYS = ("step", "optimizer", "stream", "resample_rng", "steps_since_fired", "sparsity_window", "history",
              "train_config")


def save_sae_checkpoint(folder: Union[str, Path], sae, trainer_state: dict) -> Path:
    missing = [key for key in STATE_KEYS if key not in trainer_state]
    if missing:
        raise ValueError(f"an SAE trainer state needs the keys {', '.join(missing)}")
    return save_checkpoint(folder, sae, trainer_state)


def load_sae_checkpoint(folder: Union[str, Path]) -> tuple:
    """(SAEConfig, SAE state dict, trainer state) from a checkpoint folder; CheckpointError names the
    file when the folder is not a complete, undamaged SAE checkpoint."""
    return read_checkpoint(folder, SAEConfig, STATE_KEYS, "SAE training checkpoint", "an SAE trainer state")


def save_final(sae, folder: Union[str, Path], sparsity=None) -> Path:
    """Write ``sae`` to ``folder`` (replaced whole if it exists) in SAELens's format: ``cfg.json``,
    ``sae_weights.safetensors`` and, given ``sparsity`` [d_sae] (log10 firing frequencies),
    ``sparsity.safetensors`` (``glassbox.interp.sae.format.save_sae``)."""
    from ...interp.sae.format import save_sae

    return save_sae(sae, folder, sparsity=sparsity, overwrite=True)
