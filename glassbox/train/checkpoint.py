"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is a folder:
- ``model.safetensors``: the glassbox state dict (safetensors: no code can hide in it);
- ``config.json``: the model's glassbox ``Config``;
- ``trainer_state.pt``: step, optimizer state, data-generator state, loss history and the training
  config, only plain tensors and containers, so ``torch.load(weights_only=True)`` reads it.

Files are written to a temporary folder and renamed into place, so a run killed mid-save leaves
the previous checkpoint intact.
"""

import json
import shutil
from pathlib import Path
from typing import Union

import torch

from ..models import Config

MODEL_FILE, CONFIG_FILE, STATE_FILE = "model.safetensors", "config.json", "trainer_state.pt"


def save_checkpoint(folder: Union[str, Path], model, trainer_state: dict) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    # safetensors needs contiguous tensors; W_Q/W_K/W_V are stored strided (see models/attention.py).
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / MODEL_FILE))
    (tmp / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    torch.save(trainer_state, tmp / STATE_FILE)
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old)
    else:
        tmp.rename(folder)
    return folder


def load_checkpoint(folder: Union[str, Path]) -> tuple:
    """(Config, model state dict, trainer state) from a checkpoint folder."""
    from ..weights.files import read_safetensors

    folder = Path(folder)
    for name in (MODEL_FILE, CONFIG_FILE, STATE_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} is not a training checkpoint: {name} is missing")
    cfg = Config(**json.loads((folder / CONFIG_FILE).read_text()))
    state = read_safetensors(folder / MODEL_FILE)
    trainer_state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    return cfg, state, trainer_state
