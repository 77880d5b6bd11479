"""Reading weight files safely: safetensors first, else a PyTorch checkpoint with
``torch.load(weights_only=True)``; nothing is ever unpickled beyond plain tensors.
Errors name the file and what went wrong."""

import json
from pathlib import Path

import torch

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"


def read_state_dict(folder: Path) -> dict:
    """The tensors of a Hugging Face model folder, on the CPU."""
    folder = Path(folder)
    if (folder / SAFETENSORS).is_file():
        return read_safetensors(folder / SAFETENSORS)
    if (folder / SAFETENSORS_INDEX).is_file():
        index = _read_json(folder / SAFETENSORS_INDEX)
        state = {}
        for shard in sorted(set(index.get("weight_map", {}).values())):
            state.update(read_safetensors(folder / shard))
        return state
    if (folder / PYTORCH_BIN).is_file():
        return read_torch_checkpoint(folder / PYTORCH_BIN)
    raise FileNotFoundError(f"no weights in {folder}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def read_safetensors(path: Path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
        raise ValueError(f"could not read weights file {path}: {err} (truncated or corrupted?)") from err


def read_torch_checkpoint(path: Path) -> dict:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"refused to load {path}: {err}. glassbox loads PyTorch checkpoints only with "
            "weights_only=True, which allows plain tensors and containers; a file that needs arbitrary "
            "unpickling could run code, so convert it to safetensors in a trusted environment instead"
        ) from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a flat state dict of tensors")
    return state


def read_config(folder: Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}")
    return _read_json(path)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"could not read {path}: {err}") from err
