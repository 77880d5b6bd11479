"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a folder:
- ``model.safetensors``: the glassbox state dict (safetensors: no code can hide in it);
- ``config.json``: the model's glassbox ``Config``;
- ``trainer_state.pt``: step, optimizer state, data-generator state, loss history and the training
  config, only plain tensors and containers, so ``torch.load(weights_only=True)`` reads it.

Saving is crash-safe at every instant. The files are written and flushed to disk in
``NAME.tmp``, which is then renamed ``NAME.new`` (so a ``.new`` folder is always complete); the
old ``NAME`` is renamed ``NAME.old``, ``NAME.new`` renamed ``NAME``, and ``NAME.old`` deleted.
A process killed anywhere in between leaves leftovers that ``recover_checkpoint`` (called by
``load_checkpoint`` and ``save_checkpoint``) resolves: a ``.new`` folder finishes the swap, else a
lone ``.old`` folder is put back (as left by older glassbox versions, which had no ``.new``
step), and ``.tmp``/``.old`` leftovers are removed. Each of its own
steps is one of the swap's, so recovery may be killed too.

A damaged checkpoint (a truncated or foreign file, a pickle that would need to run code) raises
``CheckpointError`` naming the file; nothing in it is ever executed.
"""

import json
import os
import shutil
from pathlib import Path
from typing import Union

import torch

from ..models import Config

MODEL_FILE, CONFIG_FILE, STATE_FILE = "model.safetensors", "config.json", "trainer_state.pt"
STATE_KEYS = ("step", "optimizer", "data_rng", "history", "train_config")


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete or damaged; the message names the file."""


def _sibling(folder: Path, suffix: str) -> Path:
    return folder.with_name(folder.name + suffix)


def _fsync(path: Path) -> None:
    """Flush a file (or, on POSIX, a folder's entries) to disk, so a power cut keeps the order."""
    if path.is_dir() and os.name == "nt":
        return  # Windows cannot open a folder; its renames are journaled by NTFS
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recover_checkpoint(folder: Union[str, Path]) -> bool:
    """Finish or undo a save that was interrupted; True if ``folder`` then holds a checkpoint."""
    folder = Path(folder)
    new, old, tmp = _sibling(folder, ".new"), _sibling(folder, ".old"), _sibling(folder, ".tmp")
    if new.is_dir():  # complete: finish its swap
        if folder.is_dir():
            if old.exists():
                shutil.rmtree(old)
            os.rename(folder, old)
        os.rename(new, folder)
        _fsync(folder.parent)
    elif old.is_dir() and not folder.exists():
        # Only an older glassbox (which renamed NAME.tmp straight to NAME) leaves this: its NAME.tmp
        # may be incomplete, the old checkpoint is not.
        os.rename(old, folder)
        _fsync(folder.parent)
    for leftover in (old, tmp):
        if leftover.exists():
            shutil.rmtree(leftover)
    return folder.is_dir()


def save_checkpoint(folder: Union[str, Path], model, trainer_state: dict) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    recover_checkpoint(folder)
    tmp, new = _sibling(folder, ".tmp"), _sibling(folder, ".new")
    tmp.mkdir(parents=True)
    # safetensors needs contiguous tensors; W_Q/W_K/W_V are stored strided (see models/attention.py).
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / MODEL_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    torch.save(trainer_state, tmp / STATE_FILE)
    for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
        _fsync(tmp / name)
    _fsync(tmp)
    os.rename(tmp, new)  # from here on the new checkpoint wins (see recover_checkpoint)
    _fsync(folder.parent)
    recover_checkpoint(folder)
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
    if not recover_checkpoint(folder):
        raise CheckpointError(f"no {what} at {folder}")
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
