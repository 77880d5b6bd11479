"""The manifest of a job's output folder: shards committed atomically, verified, resumed.

Layout of ``out_dir``::

    manifest.json          the job (kind, parameters, model spec, plan) and one entry per committed shard
    shards/shard_00007/    a committed shard's files (whatever the job's ``run_shard`` wrote)
    .tmp/                  shards being computed (``shard_00007.<uuid>/``); debris after a crash

A shard is committed in this order: its files are written under ``.tmp/shard_XXXXX.<uuid>/``, each file
is hashed (sha256) and synced, the folder is renamed to ``shards/shard_XXXXX/``, and only then is its
entry added to ``manifest.json`` (a temporary file renamed over the old one). So a crash at any point
leaves either a committed shard or debris: a shard folder without a manifest entry, or anything under
``.tmp/``, is removed when the job is opened again. A shard is never recorded half-written.

``Manifest.open(out_dir, job, resume=True)`` keeps the entries whose files are all present with their
recorded sizes and sha256 (re-hashing every byte: a resume reads the whole export once) and drops the
rest (a corrupted shard is recomputed). The job recorded must equal the job given (kind, parameters,
model spec, plan), else it is refused, naming the field that differs.

A new job's ``manifest.json`` appears with its first committed shard; a job that fails before any
commit leaves nothing behind once the runner calls ``discard_if_empty``, so the same command can be run
again without ``resume``.

Footgun: one process (the driver) owns the manifest; workers only fill temporary folders.
"""

import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Union

from .job import ShardSpec, check_plan, job_params

FORMAT = "glassbox-scale-manifest"
VERSION = 1
MANIFEST = "manifest.json"
SHARDS = "shards"
TMP = ".tmp"
HEADER_KEYS = ("format", "version", "job", "params", "model_spec", "plan")
_HASH_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_HASH_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_folder(folder: Path) -> Dict[str, dict]:
    """``{relative path: {"bytes": n, "sha256": hex}}`` for every file under ``folder``, sorted."""
    files = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return files


def combined_sha256(files: Dict[str, dict]) -> str:
    """One checksum of a shard: sha256 over its sorted ``path sha256`` lines."""
    lines = "".join(f"{name} {info['sha256']}\n" for name, info in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def verify_shard(out_dir: Path, entry: dict) -> Optional[str]:
    """None if the shard's folder holds exactly its recorded files with their sizes and sha256, else why not."""
    folder = Path(out_dir) / SHARDS / ShardSpec(entry["index"], entry["start"], entry["stop"]).name
    if not folder.is_dir():
        return f"{folder} is missing"
    recorded = entry.get("files", {})
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    if present != sorted(recorded):
        return f"{folder} holds {present}, the manifest records {sorted(recorded)}"
    for name, info in recorded.items():
        path = folder / name
        if path.stat().st_size != info["bytes"]:
            return f"{path}: {path.stat().st_size} bytes, recorded {info['bytes']}"
        if sha256_file(path) != info["sha256"]:
            return f"{path}: sha256 differs from the manifest"
    if combined_sha256(recorded) != entry.get("sha256"):
        return f"{folder}: the shard's combined sha256 differs from the manifest"
    return None


def load_manifest(out_dir: Union[str, Path]) -> dict:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {out_dir} holds no glassbox job")
    with open(path) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a glassbox job manifest (format {manifest.get('format')!r})")
    return manifest


def verify(out_dir: Union[str, Path]) -> Dict[int, str]:
    """``{shard index: problem}`` for every planned shard that is missing or does not verify ({} = all good)."""
    manifest = load_manifest(out_dir)
    entries = {int(k): v for k, v in manifest["shards"].items()}
    problems = {}
    for index, _, _ in manifest["plan"]:
        problem = verify_shard(Path(out_dir), entries[index]) if index in entries else "not committed"
        if problem is not None:
            problems[index] = problem
    return problems


def write_json(path: Path, value) -> None:
    """Write ``value`` to ``path`` atomically (a synced temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a folder; the rename is still atomic
    finally:
        os.close(fd)


def _sync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


class Manifest:
    """A job's output folder, opened by the driver (see the module docstring)."""

    def __init__(self, out_dir: Path, header: dict, entries: Dict[int, dict]):
        self.out_dir = Path(out_dir)
        self.header = header
        self.plan = [ShardSpec.from_json(s) for s in header["plan"]]
        self._entries = entries
        self.dropped: Dict[int, str] = {}  # shards found on resume that did not verify, and why

    @classmethod
    def open(cls, out_dir: Union[str, Path], job, *, resume: bool = False) -> "Manifest":
        """Open ``out_dir`` for ``job``: a new, empty (or absent) folder, or with ``resume`` an earlier
        run of the same job (its verified shards kept, debris removed)."""
        out_dir = Path(out_dir)
        plan = check_plan(job.plan())
        header = {"format": FORMAT, "version": VERSION, "job": job.name, "params": job_params(job),
                  "model_spec": dict(job.model_spec()), "plan": [s.to_json() for s in plan]}
        header = json.loads(json.dumps(header))  # as it will read back (tuples -> lists)
        if out_dir.exists() and not out_dir.is_dir():
            raise NotADirectoryError(f"out_dir {out_dir} exists and is not a folder")
        present = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
        entries: Dict[int, dict] = {}
        if (out_dir / MANIFEST).is_file():
            if not resume:
                raise FileExistsError(f"{out_dir} already holds a job ({MANIFEST}); resume it (resume=True, "
                                      "--resume) or choose a new folder")
            old = load_manifest(out_dir)
            for key in HEADER_KEYS:
                if old.get(key) != header[key]:
                    raise ValueError(f"cannot resume {out_dir}: its job's {key!r} is {old.get(key)!r}, this "
                                     f"job's is {header[key]!r}")
            entries = {int(k): v for k, v in old["shards"].items()}
        elif present and not (resume and {p for p in present if not p.startswith(f".{MANIFEST}.")} <= {SHARDS, TMP}):
            raise FileExistsError(f"out_dir {out_dir} is not empty ({', '.join(present[:5])}) and holds no "
                                  f"glassbox job; choose a new or empty folder")
        self = cls(out_dir, header, {})
        self.created = not out_dir.exists()
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out_dir / TMP, ignore_errors=True)
        for stale in out_dir.glob(f".{MANIFEST}.*"):  # a manifest write interrupted before its rename
            stale.unlink()
        for index, entry in sorted(entries.items()):
            problem = verify_shard(out_dir, entry)
            if problem is None:
                self._entries[index] = entry
            else:
                self.dropped[index] = problem
        kept = {self.plan[i].name for i in self._entries}
        if (out_dir / SHARDS).is_dir():
            for folder in (out_dir / SHARDS).iterdir():
                if folder.name not in kept:
                    shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
        if entries:  # a new job's manifest is written by its first commit
            self._write()
        return self

    def discard_if_empty(self) -> None:
        """After a failure before any commit: remove what ``open`` made, so the same command can run again."""
        if self._entries or self.path.exists():
            return
        shutil.rmtree(self.out_dir / TMP, ignore_errors=True)
        shards = self.out_dir / SHARDS
        if shards.is_dir() and not any(shards.iterdir()):
            shards.rmdir()
        if self.created and self.out_dir.is_dir() and not any(self.out_dir.iterdir()):
            self.out_dir.rmdir()

    @property
    def path(self) -> Path:
        return self.out_dir / MANIFEST

    def pending(self) -> List[ShardSpec]:
        """The planned shards not committed yet, in order."""
        return [s for s in self.plan if s.index not in self._entries]

    def is_done(self, index: int) -> bool:
        return index in self._entries

    def tmp_dir(self, spec: ShardSpec) -> Path:
        """A fresh, empty folder for computing ``spec``: ``.tmp/shard_XXXXX.<uuid>/``."""
        folder = self.out_dir / TMP / f"{spec.name}.{uuid.uuid4().hex[:12]}"
        folder.mkdir(parents=True)
        return folder

    def commit(self, spec: ShardSpec, tmp_dir: Union[str, Path], entry: dict, *, wall_s: Optional[float] = None,
               worker: Optional[str] = None, host: Optional[str] = None) -> dict:
        """Hash and sync ``tmp_dir``, rename it to ``shards/shard_XXXXX/``, record and return the entry.

        ``entry`` is what the job's ``run_shard`` returned; index, item range, files, sha256, worker,
        host and wall time are added. Committing a shard twice is refused.
        """
        if spec != self.plan[spec.index]:
            raise ValueError(f"{spec} is not in the plan ({self.plan[spec.index]})")
        if spec.index in self._entries:
            raise ValueError(f"shard {spec.index} is already committed")
        tmp_dir = Path(tmp_dir)
        reserved = {"index", "start", "stop", "files", "sha256"} & set(entry)
        if reserved:
            raise ValueError(f"run_shard's entry must not set {sorted(reserved)}; the manifest records them")
        files = hash_folder(tmp_dir)
        if not files:
            raise ValueError(f"shard {spec.index}: run_shard wrote no files under {tmp_dir}")
        _sync_files(tmp_dir)
        final = self.out_dir / SHARDS / spec.name
        final.parent.mkdir(exist_ok=True)
        if final.exists():  # an uncommitted leftover (its entry was never written)
            shutil.rmtree(final)
        os.replace(tmp_dir, final)
        _sync_dir(final.parent)
        record = {"index": spec.index, "start": spec.start, "stop": spec.stop, **entry, "files": files,
                  "sha256": combined_sha256(files), "worker": worker or f"pid{os.getpid()}",
                  "host": host or socket.gethostname(), "wall_s": wall_s, "committed_at": time.time()}
        record = json.loads(json.dumps(record))
        self._entries[spec.index] = record
        try:
            self._write()
        except BaseException:
            del self._entries[spec.index]
            raise
        return record

    def entries(self) -> List[dict]:
        """Every shard's entry in plan order; refused while any shard is not committed."""
        missing = [s.index for s in self.pending()]
        if missing:
            raise RuntimeError(f"{len(missing)} shard(s) not committed yet: {missing[:10]}")
        return [self._entries[s.index] for s in self.plan]

    def record(self, key: str, value) -> None:
        """Store a job-level result (e.g. ``"finalized"``) in the manifest."""
        if key in HEADER_KEYS or key == "shards":
            raise ValueError(f"{key!r} is a reserved manifest key")
        self.header[key] = json.loads(json.dumps(value))
        self._write()

    def _write(self) -> None:
        body = dict(self.header)
        body["shards"] = {str(k): v for k, v in sorted(self._entries.items())}
        write_json(self.path, body)
