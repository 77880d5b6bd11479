"""Reading weight files safely: safetensors first, else a PyTorch checkpoint with
``torch.load(weights_only=True)``; nothing is ever unpickled beyond plain tensors.

Errors name the file and what went wrong: a truncated safetensors file names the first tensor whose
bytes are missing (read from its header); a checkpoint that needs more than tensors to unpickle is
refused with the object it wanted; a JSON file that is not an object (a list, deep nesting) is
refused naming it.

Sharded weights: the index's ``weight_map`` is the truth. It may only name shard files inside its
own folder, every shard it names must exist, every tensor must sit in the shard the index names
(checked from the shards' headers before any tensor is read) and every tensor of a shard must be in
the index; a contradiction names the tensor and both files, rather than taking whichever shard
sorts last. ``weight_shapes`` reads only headers, so a config can be compared with the weights
before anything large is built.

Every file read (config.json, the weights, the index, each shard) must be a regular file, through
links: one that is a link to a device (/dev/zero would be read forever), a folder, a pipe, or a
dangling link is refused naming the path and what it is (``is_regular``)."""

import json
import math
import os
import stat
from pathlib import Path
from typing import Optional

import torch

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"


def is_regular(path: Path) -> bool:
    """True for a regular file (through links), False where nothing is there; a ValueError naming the
    path and what it is where something else is (a device, a folder, a pipe, a dangling link)."""
    path = Path(path)
    if path.is_file():
        return True
    if not path.is_symlink() and not path.exists():
        return False
    what = "a dangling link" if not path.exists() else _file_kind(path)
    if path.is_symlink():
        target = os.readlink(path)
        what = f"a dangling link to {target}" if not path.exists() else f"a link to {target}, a {what}"
    raise ValueError(f"{path} is {what}, not a regular file: glassbox reads model files only from regular files")


def _file_kind(path: Path) -> str:
    mode = os.stat(path).st_mode
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def weights_file(folder: Path) -> Path:
    """The file ``read_state_dict`` reads: model.safetensors, else its index, else pytorch_model.bin."""
    folder = Path(folder)
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN):
        if is_regular(folder / name):
            return folder / name
    raise FileNotFoundError(f"no weights in {folder}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def read_state_dict(folder: Path) -> dict:
    """The tensors of a Hugging Face model folder, on the CPU."""
    folder = Path(folder)
    if is_regular(folder / SAFETENSORS):
        return read_safetensors(folder / SAFETENSORS)
    if is_regular(folder / SAFETENSORS_INDEX):
        weight_map = read_index(folder)
        check_shards(folder, weight_map)
        state = {}
        for shard in sorted(set(weight_map.values())):
            state.update(read_safetensors(folder / shard))
        return state
    if is_regular(folder / PYTORCH_BIN):
        return read_torch_checkpoint(folder / PYTORCH_BIN)
    raise FileNotFoundError(f"no weights in {folder}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")


def weight_shapes(folder: Path) -> dict:
    """Tensor name -> shape of a folder's weights, from the safetensors headers alone (no tensor is
    read; sharded weights are checked against their index first). A PyTorch checkpoint has no
    header, so it is read."""
    folder = Path(folder)
    if is_regular(folder / SAFETENSORS):
        return safetensors_shapes(folder / SAFETENSORS)
    if is_regular(folder / SAFETENSORS_INDEX):
        shapes = {}
        for found in check_shards(folder, read_index(folder)).values():
            shapes.update(found)
        return shapes
    return {name: tuple(t.shape) for name, t in read_state_dict(folder).items()}


# safetensors' names of the floating dtypes glassbox computes in (others, such as F8_E4M3, are refused).
SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


def stored_dtype(folder: Path, tensors: Optional[dict] = None) -> Optional[torch.dtype]:
    """The floating dtype that most of a folder's weights (counted in elements) are stored in, from the
    safetensors headers alone (or from ``tensors``, a PyTorch checkpoint already read); None when no
    tensor is floating-point. A floating dtype glassbox does not compute in (float8) is a ValueError
    naming the file."""
    folder = Path(folder)
    counts, where = {}, {}
    if tensors is not None:
        items = [(f"the checkpoint in {folder}", str(t.dtype).replace("torch.", ""),
                  t.dtype if t.is_floating_point() else None, t.numel()) for t in tensors.values()]
    else:
        items = []
        for path, header in _headers(folder):
            for dtype, shape in header.values():
                torch_dtype = SAFETENSORS_DTYPES.get(dtype, dtype if dtype.startswith(("F", "BF")) else None)
                items.append((str(path), dtype, torch_dtype, math.prod(shape)))
    for path, name, dtype, numel in items:
        if dtype is not None:
            counts[dtype] = counts.get(dtype, 0) + numel
            where.setdefault(dtype, (path, name))
    if not counts:
        return None
    most = max(counts, key=lambda d: (counts[d], str(d)))
    if most not in SAFETENSORS_DTYPES.values():
        path, name = where[most]
        raise ValueError(f"{path} stores its weights in {name}, a dtype glassbox does not compute in; pass "
                         "dtype=torch.float32, torch.bfloat16 or torch.float16 to convert them")
    return most


def _headers(folder: Path) -> list:
    """[(safetensors file, {tensor: (dtype name, shape)})] of a folder's weights, headers only."""
    from safetensors import safe_open

    if is_regular(folder / SAFETENSORS):
        paths = [folder / SAFETENSORS]
    elif is_regular(folder / SAFETENSORS_INDEX):
        paths = [folder / shard for shard in sorted(set(read_index(folder).values()))]
    else:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    headers = []
    for path in paths:
        try:
            with safe_open(str(path), framework="pt") as f:
                headers.append((path, {name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape()))
                                       for name in f.keys()}))
        except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
            raise ValueError(f"could not read weights file {path}: {err}{_safetensors_diagnosis(path)}") from err
    return headers


def read_index(folder: Path) -> dict:
    """The ``weight_map`` of a sharded folder's index: tensor name -> shard file name, validated."""
    path = Path(folder) / SAFETENSORS_INDEX
    index = _read_json(path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{path}: 'weight_map' must be a non-empty object mapping tensor names to shard "
                         f"files, got {type(weight_map).__name__}")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise ValueError(f"{path} names shard {shard!r}, which is not a file name in the same folder "
                             f"(for tensor {name})")
    for shard in sorted(set(weight_map.values())):
        if not is_regular(Path(folder) / shard):
            tensors = [n for n, s in weight_map.items() if s == shard]
            raise ValueError(f"{path} maps {len(tensors)} tensor(s) (e.g. {tensors[0]}) to shard {shard}, "
                             f"which is not in {folder}")
    return weight_map


def check_shards(folder: Path, weight_map: dict) -> dict:
    """Shard -> {tensor: shape} from the shards' headers, each tensor where the index says it is."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    found = {}
    for shard in sorted(set(weight_map.values())):
        found[shard] = safetensors_shapes(folder / shard)
        for name in found[shard]:
            mapped = weight_map.get(name)
            if mapped is None:
                raise ValueError(f"{folder / shard} holds tensor {name}, which {index} does not list: "
                                 "the index and the shards disagree")
            if mapped != shard:
                raise ValueError(f"tensor {name} is in {folder / shard}, but {index} maps it to {mapped}: "
                                 "the index and the shards contradict each other")
    for name, shard in weight_map.items():
        if name not in found[shard]:
            raise ValueError(f"{index} maps tensor {name} to {folder / shard}, which does not hold it")
    return found


def safetensors_shapes(path: Path) -> dict:
    """Tensor name -> shape from a safetensors file's header, without reading any tensor."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
        raise ValueError(f"could not read weights file {path}: {err}{_safetensors_diagnosis(Path(path))}") from err


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
    if not is_regular(path):
        raise FileNotFoundError(f"no config.json in {folder}")
    return _read_json(path)


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``; anything else (bad JSON, a list, nesting too deep) names the file."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"could not read {path}: {err}") from err
    except RecursionError:
        raise ValueError(f"could not read {path}: its JSON is nested too deeply to parse") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got a JSON {_json_kind(value)}")
    return value


def _json_kind(value) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__)
