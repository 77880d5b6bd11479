"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a folder:
- ``model.safetensors``: the glassbox state dict (safetensors: no code can hide in it);
- ``config.json``: the model's glassbox ``Config``;
- ``trainer_state.pt``: step, optimizer state, data-generator state, loss history and the training
  config, only plain tensors and containers, so ``torch.load(weights_only=True)`` reads it.

Saving goes through ``glassbox.fs.FolderWriter`` (owner "checkpoint"): the three files are written
under temporary names in the folder, flushed, and renamed into place after a journal, so a process
killed at any instant leaves the old checkpoint or the new one once ``recover_checkpoint`` (called
by ``load_checkpoint`` and ``save_checkpoint``) has finished or undone the commit; recovery may be
killed too. Other files in the folder are kept. The leftovers of earlier versions' folder swaps
(``NAME.new``, ``NAME.old``, ``NAME.tmp``) are resolved too (``glassbox.fs.legacy``). A full disk is an
``OSError`` naming the file (never torch's ``[enforce fail ...]``).

A damaged checkpoint (a truncated or foreign file, a pickle that would need to run code) raises
``CheckpointError`` naming the file; nothing in it is ever executed.
"""

import json
from pathlib import Path
from typing import Union

import torch

from ..fs import FolderWriter, recover
from ..fs.legacy import recover_checkpoint_siblings
from ..models import Config

MODEL_FILE, CONFIG_FILE, STATE_FILE = "model.safetensors", "config.json", "trainer_state.pt"
OWNER = "checkpoint"
STATE_KEYS = ("step", "optimizer", "data_rng", "history", "train_config")


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete or damaged; the message names the file."""


def recover_checkpoint(folder: Union[str, Path]) -> bool:
    """Finish or undo a save that was interrupted; True if ``folder`` then holds a checkpoint's files."""
    folder = Path(folder)
    recover_checkpoint_siblings(folder)
    recover(folder)
    return folder.is_dir() and any((folder / name).exists() for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE))


def save_checkpoint(folder: Union[str, Path], model, trainer_state: dict) -> Path:
    folder = Path(folder)
    recover_checkpoint_siblings(folder)
    # safetensors needs contiguous tensors; W_Q/W_K/W_V are stored strided (see models/attention.py).
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with FolderWriter(folder, OWNER, adopt=(MODEL_FILE, CONFIG_FILE, STATE_FILE)) as writer:
        writer.save_safetensors(MODEL_FILE, state)
        writer.write_text(CONFIG_FILE, json.dumps(model.cfg.to_dict(), indent=2) + "\n")
        writer.save_torch(STATE_FILE, trainer_state)
    return folder


def load_checkpoint(folder: Union[str, Path]) -> tuple:
    """(Config, model state dict, trainer state) from a checkpoint folder.

    Raises CheckpointError naming the file if the folder is not a complete, undamaged checkpoint.
    """
    return read_checkpoint(folder, Config, STATE_KEYS, "training checkpoint", "a glassbox trainer state")


def read_checkpoint(folder: Union[str, Path], config_class, state_keys: tuple, what: str, state_what: str) -> tuple:
    """(config_class(**config.json), model.safetensors' tensors, trainer_state.pt) of a checkpoint folder,
    recovered first (see recover_checkpoint); CheckpointError naming the file for anything missing or
    damaged, or a trainer state without ``state_keys``. Shared by the model's and the SAE's trainers."""
    from ..weights.files import read_safetensors

    folder = Path(folder)
    if not recover_checkpoint(folder) and not folder.is_dir():
        raise CheckpointError(f"no {what} at {folder}")  # an existing folder: the missing file is named below
    for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder} is not a {what}: {name} is missing")
    try:
        cfg = config_class(**json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"damaged checkpoint file {folder / CONFIG_FILE}: {first_line(error)}") from error
    try:
        state = read_safetensors(folder / MODEL_FILE)
    except ValueError as error:
        raise CheckpointError(f"damaged checkpoint file {folder / MODEL_FILE}: {first_line(error)}") from error
    try:
        # weights_only=True: a pickle that would build an arbitrary object (run code) is refused.
        trainer_state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for bad files
        raise CheckpointError(f"damaged or unsafe checkpoint file {folder / STATE_FILE}: "
                              f"{first_line(error)}") from error
    if not isinstance(trainer_state, dict) or any(key not in trainer_state for key in state_keys):
        raise CheckpointError(f"checkpoint file {folder / STATE_FILE} is not {state_what} "
                              f"(needs the keys {', '.join(state_keys)})")
    return cfg, state, trainer_state


def first_line(error: Exception) -> str:
    """The first line of an error's message (its type name when the message is empty), for one-line errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
