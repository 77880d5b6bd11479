"""Reading a job's ``manifest.json`` back, checked, and comparing it with the job being resumed.

``load_manifest`` refuses (ValueError naming the file and the key) a manifest that is not JSON, not
glassbox's format or version, or whose fields have the wrong types or contradict its plan (an entry
off the plan, a file path leaving its shard's folder): a hand-edited manifest never steers what a
resume verifies or deletes. ``check_same_job`` names the first difference between the recorded job
and this one (``params.shard_size was 2, now 4``, or the model file that changed);
``check_no_foreign_files`` refuses a committed shard's folder holding files the manifest does not record.
Every check runs before ``Manifest.open`` deletes anything.
"""

import json
import re
from pathlib import Path
from typing import Dict, List, Union

from .fingerprint import describe_change
from .job import ShardSpec, check_plan

FORMAT = "glassbox-scale-manifest"
VERSION = 2
MANIFEST = "manifest.json"
SHARDS = "shards"


def load_manifest(out_dir: Union[str, Path]) -> dict:
    """The manifest of ``out_dir``, checked: a damaged or hand-edited one is a ValueError naming the key."""
    path = Path(out_dir) / MANIFEST
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a file; glassbox neither resumes nor deletes anything in {out_dir}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {out_dir} holds no glassbox job")
    try:
        manifest = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged (not valid JSON: {error}); glassbox neither resumes nor deletes "
                         f"anything in {out_dir}: restore the file or choose a new folder") from None
    check_manifest(manifest, path)
    return manifest


def _bad(path: Path, what: str) -> ValueError:
    return ValueError(f"{path} is damaged or was edited by hand: {what}; glassbox neither resumes nor deletes "
                      f"anything in {path.parent}: restore the file or choose a new folder")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_manifest(manifest, path: Path) -> None:
    """Every field a runner reads, with its type; entries consistent with the plan (see load_manifest)."""
    if not isinstance(manifest, dict):
        raise _bad(path, f"it holds a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a glassbox job manifest (format {manifest.get('format')!r}, expected "
                         f"{FORMAT!r}); glassbox neither resumes nor deletes anything in {path.parent}")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path} is a version {manifest.get('version')!r} manifest; this glassbox reads version "
                         f"{VERSION} (which records the model's fingerprint), so it cannot tell whether the model "
                         "is the one the job started with: run the job again into a new folder")
    for key, kind, word in (("job", str, "string"), ("params", dict, "object"), ("model_spec", dict, "object"),
                            ("fingerprint", dict, "object"), ("plan", list, "list"), ("shards", dict, "object")):
        if not isinstance(manifest.get(key), kind):
            raise _bad(path, f"{key!r} must be a JSON {word}, got {type(manifest.get(key)).__name__}")
    try:
        plan = check_plan([ShardSpec.from_json(s) if isinstance(s, list) and len(s) == 3 else s
                           for s in manifest["plan"]])
    except (TypeError, ValueError) as error:
        raise _bad(path, f"'plan': {error}") from None
    for key, entry in manifest["shards"].items():
        where = f"'shards'[{key!r}]"
        if not key.isdigit() or int(key) >= len(plan):
            raise _bad(path, f"{where}: no shard {key} in the plan of {len(plan)}")
        if not isinstance(entry, dict):
            raise _bad(path, f"{where} must be an object, got {type(entry).__name__}")
        spec = plan[int(key)]
        for field, want in (("index", spec.index), ("start", spec.start), ("stop", spec.stop)):
            if not _is_int(entry.get(field)) or entry[field] != want:
                raise _bad(path, f"{where}[{field!r}] is {entry.get(field)!r}, the plan says {want}")
        files = entry.get("files")
        if not isinstance(files, dict) or not files:
            raise _bad(path, f"{where}['files'] must be a non-empty object")
        for name, info in files.items():
            parts = Path(name).parts
            if not name or Path(name).is_absolute() or ".." in parts or "\\" in name:
                raise _bad(path, f"{where}['files'] names {name!r}, not a path inside the shard's folder")
            if (not isinstance(info, dict) or not _is_int(info.get("bytes")) or info["bytes"] < 0
                    or not isinstance(info.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", info["sha256"])):
                raise _bad(path, f"{where}['files'][{name!r}] must be {{'bytes': int, 'sha256': 64 hex digits}}, "
                           f"got {info!r}")
        if not isinstance(entry.get("sha256"), str):
            raise _bad(path, f"{where}['sha256'] must be a string")


def check_same_job(out_dir: Path, old: dict, header: dict) -> None:
    """Refuse, naming what changed, a resume whose job differs from the recorded one."""
    for key in ("params", "model_spec", "plan"):
        if old[key] != header[key]:
            where, was, now = _first_difference(old[key], header[key], key)
            raise ValueError(f"cannot resume {out_dir}: the job's {where} was {json.dumps(was)[:300]}, now "
                             f"{json.dumps(now)[:300]}; resume with the same inputs or choose a new folder")
    change = describe_change(old["fingerprint"], header["fingerprint"])
    if change is not None:
        raise ValueError(f"cannot resume {out_dir}: {change}; its shards would mix two models. Choose a new folder "
                         "(or restore the model)")


def _first_difference(old, new, where: str):
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if old.get(key, _MISSING) != new.get(key, _MISSING):
                return _first_difference(old.get(key), new.get(key), f"{where}.{key}")
    return where, old, new


_MISSING = object()


def check_no_foreign_files(out_dir: Path, entries: Dict[int, dict], names: List[str]) -> None:
    """Refuse (before anything is deleted) a committed shard folder holding files the manifest does not
    record: glassbox never wrote them, so it will neither delete nor keep them as part of the job."""
    for index, entry in sorted(entries.items()):
        folder = out_dir / SHARDS / names[index]
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise ValueError(f"{folder} is not the folder glassbox committed (a link or a file); move it away "
                             "and resume again")
        if not folder.is_dir():
            continue
        extra = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if not p.is_dir() and p.relative_to(folder).as_posix() not in entry["files"])
        if extra:
            raise ValueError(f"{folder} holds {', '.join(extra[:5])}, which glassbox did not write (its manifest "
                             "records the shard's files); move them out of the folder and resume again")
