"""SAE training checkpoints and the saved SAE.

A checkpoint is a folder written by ``glassbox.train.checkpoint.save_checkpoint`` (crash-safe at
every instant, see there): ``model.safetensors`` (the SAE's state dict, as trained: a TopK SAE's
decoder rows not yet folded to norm 1), ``config.json`` (its ``SAEConfig``) and ``trainer_state.pt``
(plain tensors and containers only, read with ``torch.load(weights_only=True)``). A damaged one
raises ``CheckpointError`` naming the file; nothing in it is ever executed.

``save_final`` writes the trained SAE in SAELens's folder format (``cfg.json`` and
``sae_weights.safetensors``), which SAELens's ``SAE.load_from_disk`` and glassbox's ``load_sae`` read.
"""

import json
from pathlib import Path
from typing import Union

import torch

from ...interp.sae.config import SAEConfig
from ..checkpoint import (CONFIG_FILE, MODEL_FILE, STATE_FILE, CheckpointError, first_line, recover_checkpoint,
                          save_checkpoint)

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
    from ...weights.files import read_safetensors

    folder = Path(folder)
    if not recover_checkpoint(folder):
        raise CheckpointError(f"no SAE training checkpoint at {folder}")
    for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder} is not an SAE training checkpoint: {name} is missing")
    try:
        cfg = SAEConfig(**json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"damaged checkpoint file {folder / CONFIG_FILE}: {first_line(error)}") from error
    try:
        state = read_safetensors(folder / MODEL_FILE)
    except ValueError as error:
        raise CheckpointError(f"damaged checkpoint file {folder / MODEL_FILE}: {first_line(error)}") from error
    try:
        trainer_state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for bad files
        raise CheckpointError(f"damaged or unsafe checkpoint file {folder / STATE_FILE}: "
                              f"{first_line(error)}") from error
    if not isinstance(trainer_state, dict) or any(key not in trainer_state for key in STATE_KEYS):
        raise CheckpointError(f"checkpoint file {folder / STATE_FILE} is not an SAE trainer state "
                              f"(needs the keys {', '.join(STATE_KEYS)})")
    return cfg, state, trainer_state


def save_final(sae, folder: Union[str, Path], sparsity=None) -> Path:
    """Write ``sae`` to ``folder`` (replaced whole if it exists) in SAELens's format: ``cfg.json``,
    ``sae_weights.safetensors`` and, given ``sparsity`` [d_sae] (log10 firing frequencies),
    ``sparsity.safetensors`` (``glassbox.interp.sae.format.save_sae``)."""
    from ...interp.sae.format import save_sae

    return save_sae(sae, folder, sparsity=sparsity, overwrite=True)
