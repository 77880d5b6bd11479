"""The manifest of a job's output folder: shards committed atomically, verified, resumed; only glassbox's files touched.

Layout of ``out_dir``::

    manifest.json          the job (kind, parameters, model spec, model fingerprint, plan) and one entry per
                           committed shard
    shards/shard_00007/    a committed shard's files (whatever the job's ``run_shard`` wrote)
    .tmp/                  shards being computed (``shard_00007.<uuid>/``); debris after a crash

A new job needs a new or empty folder (or one holding only ``glassbox.fs``'s ``.glassbox-tmp-*``
leftovers: a first manifest write killed before its rename); its ``manifest.json`` is written first
(with no shards), so every later file is in a folder glassbox marked as its own. A shard is committed in this order: its
files are written under ``.tmp/shard_XXXXX.<uuid>/``, each file is hashed (sha256) and synced, the
folder is renamed to ``shards/shard_XXXXX/``, and only then is its entry added to ``manifest.json``
(written whole by ``glassbox.fs``: a synced temporary sibling renamed over the old one). So a crash at any point leaves either a committed shard or
debris: a planned shard's folder without a manifest entry, or glassbox's temporary folders under
``.tmp/``, removed when the job is resumed. A shard is never recorded half-written.

Resume (``Manifest.open(out_dir, job, resume=True)``) is refused (``manifest_checks.py``), before
anything is deleted, for:
a folder with no ``manifest.json`` that is not empty (even one holding only ``shards/`` or ``.tmp/``:
glassbox resumes only what it wrote); a manifest that is damaged or hand-edited (not JSON, a field
of the wrong type, an entry that contradicts the plan), of another format version, or of another job
kind; a job whose parameters, model spec or plan differ, or whose model fingerprint
(``fingerprint.py``: the sha256 of the model's config, weights and tokenizer files) differs, naming
what changed; a committed shard's folder holding files the manifest does not record. Otherwise the
entries whose files are all present with their recorded sizes and sha256 are kept (every byte is
re-hashed: a resume reads the whole output once) and the rest are recomputed.

What glassbox deletes: only names it makes (``.tmp/shard_XXXXX.<12 hex>``, ``.tmp/ray_probe.<12 hex>``,
``glassbox.fs``'s ``.glassbox-tmp-*`` leftovers, a planned ``shards/shard_XXXXX`` whose files do not
verify or that has no entry; and a job's earlier outputs, through the record of ``finalize``'s
``glassbox.fs.FolderWriter``, see ``outputs``). A user's other files in the folder, in ``shards/`` or in
``.tmp/`` are left as they are.

A job that fails before any commit leaves nothing behind once the runner calls ``discard_if_empty``,
so the same command can be run again without ``resume``; ``tidy`` removes an empty ``.tmp/`` after a
successful run
(``run_job`` calls it after ``finalize``).

Footgun: one process (the driver) owns the manifest; workers only fill temporary folders.
"""

import hashlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Union

from ..fs import TMP_PREFIX as FS_TMP_PREFIX
from ..fs import recover, write_text
from ..fs.staged import commit_staged, remove_empty_dir, remove_tree
from .fingerprint import Fingerprint, model_fingerprint, sha256_file
from .job import ShardSpec, check_plan, job_params
from .manifest_checks import (FORMAT, MANIFEST, SHARDS, VERSION, check_no_foreign_files, check_same_job,
                              load_manifest)

TMP = ".tmp"
HEADER_KEYS = ("format", "version", "job", "params", "model_spec", "fingerprint", "plan")
_TMP_ENTRY = re.compile(r"(shard_\d{5,}|ray_probe)\.[0-9a-f]{12}")  # what tmp_dir and the Ray probe make


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


def remove_debris(out_dir: Path) -> None:
    """Remove what an interrupted run left, and only that: glassbox's own temporary folders under
    ``.tmp/``, and in the folder itself what ``glassbox.fs`` left (``.glassbox-tmp-*`` files, a journal
    of the finalize's outputs it finishes); anything else stays."""
    tmp = out_dir / TMP
    if tmp.is_dir() and not tmp.is_symlink():
        for entry in tmp.iterdir():
            if _TMP_ENTRY.fullmatch(entry.name) and not entry.is_symlink():
                remove_tree(entry)
        remove_empty_dir(tmp)
    recover(out_dir)  # a manifest write or a finalize interrupted: glassbox.fs finishes or removes it


def outputs(out_dir: Union[str, Path], job_name: str):
    """The ``glassbox.fs.FolderWriter`` a job's ``finalize`` writes its results in ``out_dir`` with: written
    whole on leaving the block, its earlier results (and only those) replaced, a user's files kept."""
    from ..fs import FolderWriter

    return FolderWriter(out_dir, owner=f"scale-{job_name}")


def tidy(out_dir: Union[str, Path]) -> None:
    """After a successful run: remove ``.tmp/`` when nothing is left in it."""
    remove_empty_dir(Path(out_dir) / TMP)


def write_json(path: Path, value) -> None:
    """Write ``value`` to ``path`` whole (``glassbox.fs``: a synced temporary sibling renamed over it)."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


class Manifest:
    """A job's output folder, opened by the driver (see the module docstring)."""

    def __init__(self, out_dir: Path, header: dict, entries: Dict[int, dict]):
        self.out_dir = Path(out_dir)
        self.header = header
        self.plan = [ShardSpec.from_json(s) for s in header["plan"]]
        self._entries = entries
        self.dropped: Dict[int, str] = {}  # shards found on resume that did not verify, and why
        self.fingerprint: Optional[Fingerprint] = None
        self.created = self.new = False

    @classmethod
    def open(cls, out_dir: Union[str, Path], job, *, resume: bool = False) -> "Manifest":
        """Open ``out_dir`` for ``job``: a new, empty (or absent) folder, or with ``resume`` an earlier
        run of the same job (its verified shards kept, glassbox's own debris removed)."""
        out_dir = Path(out_dir)
        plan = check_plan(job.plan())
        fingerprint = model_fingerprint(job.model_spec())
        header = {"format": FORMAT, "version": VERSION, "job": job.name, "params": job_params(job),
                  "model_spec": dict(job.model_spec()), "fingerprint": fingerprint.record,
                  "plan": [s.to_json() for s in plan]}
        header = json.loads(json.dumps(header))  # as it will read back (tuples -> lists)
        if out_dir.exists() and not out_dir.is_dir():
            raise NotADirectoryError(f"out_dir {out_dir} exists and is not a folder")
        present = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
        entries: Dict[int, dict] = {}
        if MANIFEST in present:
            old = load_manifest(out_dir)
            if old["job"] != header["job"]:
                raise ValueError(f"{out_dir} holds a {old['job']!r} job, not a {header['job']!r} one; choose another "
                                 "folder")
            if not resume:
                raise FileExistsError(f"{out_dir} already holds a job ({MANIFEST}); resume it (resume=True, "
                                      "--resume) or choose a new folder")
            check_same_job(out_dir, old, header)
            entries = {int(k): v for k, v in old["shards"].items()}
            check_no_foreign_files(out_dir, entries, [s.name for s in plan])
        elif [name for name in present if not name.startswith(FS_TMP_PREFIX)]:
            raise FileExistsError(f"out_dir {out_dir} is not empty ({', '.join(present[:5])}) and holds no glassbox "
                                  f"job ({MANIFEST}); glassbox resumes only a folder it wrote and starts a job only in "
                                  "a new or empty folder: choose one")
        self = cls(out_dir, header, {})
        self.fingerprint = fingerprint
        self.created = not out_dir.exists()
        self.new = not entries and MANIFEST not in present
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.new:
            recover(out_dir)  # only a manifest write killed before its rename was here (.glassbox-tmp-*)
            self._write()  # the folder is glassbox's from here on: .tmp/ and shards/ come after
            return self
        remove_debris(out_dir)
        for index, entry in sorted(entries.items()):
            problem = verify_shard(out_dir, entry)
            if problem is None:
                self._entries[index] = entry
            else:
                self.dropped[index] = problem
        kept = {self.plan[i].name for i in self._entries}
        planned = {s.name for s in self.plan}
        if (out_dir / SHARDS).is_dir():
            for folder in (out_dir / SHARDS).iterdir():
                # a dropped shard, or one renamed into place whose entry was never written
                if folder.name in planned and folder.name not in kept and not folder.is_symlink():
                    remove_tree(folder)
        self._write()
        return self

    def discard_if_empty(self) -> None:
        """After a failure before any commit: remove what ``open`` made, so the same command can run again."""
        if self._entries:
            return
        remove_debris(self.out_dir)
        if not self.new:
            return  # an earlier run's manifest stays: the job is still resumable
        shards = self.out_dir / SHARDS
        if shards.is_dir() and not shards.is_symlink():
            planned = {s.name for s in self.plan}
            for folder in shards.iterdir():  # renamed into place by a commit whose manifest write failed
                if folder.name in planned and not folder.is_symlink():
                    remove_tree(folder)
            remove_empty_dir(shards)
        remove_tree(self.path)
        if self.created:
            remove_empty_dir(self.out_dir)

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
        # glassbox.fs flushes the shard, replaces an uncommitted leftover (its entry was never written) and renames
        commit_staged(tmp_dir, self.out_dir / SHARDS / spec.name)
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
