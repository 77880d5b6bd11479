"""Reading weight files safely: safetensors first, else a PyTorch checkpoint with
``torch.load(weights_only=True)``; nothing is ever unpickled beyond plain tensors.

Errors name the file and what went wrong: a truncated safetensors file names the first tensor whose
bytes are missing (read from its header); a checkpoint that needs more than tensors to unpickle is
refused with the object it wanted; an index may only name shard files inside its own folder."""

import json
from pathlib import Path

import torch

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"


def weights_file(folder: Path) -> Path:
    """The file ``read_state_dict`` reads: model.safetensors, else its index, else pytorch_model.bin."""
    folder = Path(folder)
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no weights in {folder}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def read_state_dict(folder: Path) -> dict:
    """The tensors of a Hugging Face model folder, on the CPU."""
    folder = Path(folder)
    if (folder / SAFETENSORS).is_file():
        return read_safetensors(folder / SAFETENSORS)
    if (folder / SAFETENSORS_INDEX).is_file():
        index = _read_json(folder / SAFETENSORS_INDEX)
        state = {}
        for shard in sorted(set(index.get("weight_map", {}).values())):
            if not isinstance(shard, str) or Path(shard).name != shard:
                raise ValueError(f"{folder / SAFETENSORS_INDEX} names shard {shard!r}, which is not a file name "
                                 "in the same folder")
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
        raise ValueError(f"could not read weights file {path}: {err}{_safetensors_diagnosis(Path(path))}") from err


def _safetensors_diagnosis(path: Path) -> str:
    """Which tensor a damaged safetensors file lost, from its header: 8 bytes of header length, a
    JSON header of name -> {dtype, shape, data_offsets}, then the data."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if length > size - 8:
                return f" (its header claims {length} bytes but the file has {size}: truncated or not safetensors)"
            header = json.loads(f.read(length))
        tensors = sorted(((info["data_offsets"], name) for name, info in header.items() if name != "__metadata__"))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return " (corrupted header)"
    data = size - 8 - length
    cut = [(end, name) for (start, end), name in tensors if end > data]
    if cut:
        end, name = cut[0]
        return (f" (truncated: tensor {name} needs data bytes up to {end} but the file holds {data}; "
                f"{len(cut)} tensor(s) incomplete)")
    return " (corrupted?)"


def read_torch_checkpoint(path: Path) -> dict:
    import pickle

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        wanted = next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line or "Unsupported" in line),
                      str(err).splitlines()[0] if str(err) else type(err).__name__)
        raise ValueError(
            f"refused to load {path}: it needs more than plain tensors to unpickle ({wanted}). glassbox loads "
            "PyTorch checkpoints only with torch.load(weights_only=True), because unpickling arbitrary objects "
            "can run code; if you trust the file, convert it to safetensors in a trusted environment"
        ) from None
    except Exception as err:  # a damaged zip archive, a file that is not a checkpoint at all
        raise ValueError(f"could not read weights file {path}: {str(err).splitlines()[0]} (truncated or "
                         "corrupted?)") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        what = type(state).__name__ if not isinstance(state, dict) else \
            next(f"{k!r} is a {type(v).__name__}" for k, v in state.items() if not isinstance(v, torch.Tensor))
        raise ValueError(f"{path} does not hold a flat state dict of tensors ({what})")
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
