"""The fingerprint of a job's model: every file that determines its numbers, hashed, so a resume cannot mix models.

A job's manifest records its parameters and model spec (name, device, dtype, weight-processing flags), but
the same ``--model`` path (or shipped name, or hub repo id) can hold other weights tomorrow. So the
manifest also records ``model_fingerprint(spec)``:

- a ``name_or_path`` spec: the folder it resolves to (a folder, a shipped model, a hub snapshot: the
  same ``resolve`` that ``from_pretrained`` uses) and, for each file that determines the numbers,
  its size and sha256: ``config.json``; the weights (``model.safetensors``, or the index and every
  shard its ``weight_map`` names, or ``pytorch_model.bin``); and every tokenizer file present
  (``TOKENIZER_FILES``). Every byte is hashed (no size-and-mtime shortcut across runs: a copy with
  ``cp -p`` keeps the mtime): measured 6.1 to 7.4 s per GiB on one core of a loaded 2-core AMD EPYC
  (``sha256_file`` of a 256 MiB file, 3 runs), paid once per run and resume.
- a ``factory`` spec: the target and the sha256 of the source file of its module (None when the
  module cannot be found here). Footgun: files a factory reads by itself are not fingerprinted; pass
  them in a folder spec instead.

``Fingerprint.check_unchanged`` re-checks within one run that no file changed between the hashing and
the model build (its size, mtime and ctime as ``os.stat`` saw them when hashing, and where they
differ, its sha256 again): a model is built from the bytes the manifest records, or refused.

``describe_change(old, new)`` names what differs between two fingerprints (the file and both sha256).
"""

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..weights.files import PYTORCH_BIN, SAFETENSORS, SAFETENSORS_INDEX

TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "added_tokens.json")
_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _stat(path: Path) -> Tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def model_files(folder: Path) -> list:
    """The files of a model folder that determine its numbers (see the module docstring), sorted."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"the model folder {folder} has no config.json")
    names = ["config.json"]
    if (folder / SAFETENSORS).is_file():
        names.append(SAFETENSORS)
    elif (folder / SAFETENSORS_INDEX).is_file():
        from ..weights.files import read_index

        names.append(SAFETENSORS_INDEX)
        names += sorted(set(read_index(folder).values()))
    elif (folder / PYTORCH_BIN).is_file():
        names.append(PYTORCH_BIN)
    else:
        raise FileNotFoundError(f"no weights in {folder}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN}")
    names += [n for n in TOKENIZER_FILES if (folder / n).is_file()]
    for name in names:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"the model folder {folder} has no {name} (named by {SAFETENSORS_INDEX})")
    return sorted(set(names))


class Fingerprint:
    """``record``: what the manifest stores (JSON). ``folder`` and ``stats``: what this process saw."""

    def __init__(self, record: dict, folder: Optional[Path] = None, stats: Optional[Dict[str, tuple]] = None):
        self.record, self.folder, self.stats = record, folder, dict(stats or {})

    def check_unchanged(self, where: str = "") -> None:
        """ValueError naming the file if a fingerprinted file changed since it was hashed."""
        if self.folder is None:
            return
        for name, seen in self.stats.items():
            path = self.folder / name
            try:
                now = _stat(path)
            except OSError:
                raise ValueError(f"the model's file {path} disappeared after it was fingerprinted{where}") from None
            if now != seen and sha256_file(path) != self.record["files"][name]["sha256"]:
                raise ValueError(f"the model's file {path} changed after it was fingerprinted{where}: the job would "
                                 "mix models; run it again once the model's files are final")


def model_fingerprint(model_spec: dict) -> Fingerprint:
    """The fingerprint of the model a job's spec builds (see the module docstring)."""
    spec = dict(model_spec)
    if "factory" in spec:
        module = str(spec["factory"]).partition(":")[0]
        try:
            found = importlib.util.find_spec(module) if module else None
        except (ImportError, ValueError):
            found = None
        origin = Path(found.origin) if found is not None and found.origin and Path(found.origin).is_file() else None
        return Fingerprint({"factory": str(spec["factory"]),
                            "module_sha256": sha256_file(origin) if origin is not None else None})
    if "name_or_path" not in spec:
        raise ValueError(f"model_spec needs 'name_or_path' or 'factory', got keys {sorted(spec)}")
    from ..weights.pretrained import resolve

    folder = resolve(spec["name_or_path"])
    files, stats = {}, {}
    for name in model_files(folder):
        path = folder / name
        before = _stat(path)
        digest = sha256_file(path)
        if _stat(path) != before:
            raise ValueError(f"the model's file {path} changed while it was being fingerprinted")
        files[name] = {"bytes": before[0], "sha256": digest}
        stats[name] = before
    return Fingerprint({"folder": str(Path(folder).resolve()), "files": files}, Path(folder), stats)


def describe_change(old, new) -> Optional[str]:
    """What differs between two fingerprint records, in words (None when they are equal)."""
    if old == new:
        return None
    if not isinstance(old, dict) or not isinstance(new, dict):
        return f"the model fingerprint was {json.dumps(old)[:200]}, now {json.dumps(new)[:200]}"
    if "files" in old and "files" in new and isinstance(old["files"], dict):
        for name in sorted(set(old["files"]) | set(new["files"])):
            a, b = old["files"].get(name), new["files"].get(name)
            if a is None:
                return f"the model now has a file {name} it did not have"
            if b is None:
                return f"the model's file {name} is gone"
            if a != b:
                return (f"the model's file {name} changed ({_short(a)} -> {_short(b)}): the weights, config or "
                        "tokenizer at that path are not the ones this job started with")
        return f"the model's folder was {old.get('folder')}, now {new.get('folder')}"
    if "module_sha256" in old and "module_sha256" in new and old.get("factory") == new.get("factory"):
        return f"the source of the model factory {new['factory']}'s module changed"
    return f"the model was {json.dumps(old)[:200]}, now {json.dumps(new)[:200]}"


def _short(info) -> str:
    if isinstance(info, dict):
        return f"{info.get('bytes')} bytes, sha256 {str(info.get('sha256'))[:12]}"
    return repr(info)[:60]
