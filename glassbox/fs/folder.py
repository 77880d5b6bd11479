"""Multi-file outputs (a model, an SAE, a checkpoint) replaced in place, crash-safe, keeping a user's files.

    with FolderWriter(folder, owner="sae", adopt=("cfg.json", "sae_weights.safetensors")) as w:
        w.save_safetensors("sae_weights.safetensors", tensors)
        w.write_text("cfg.json", text)
    # leaving the block commits; an exception inside it aborts (the folder is left as it was)

On commit the folder holds exactly the files written in the block among glassbox's own, in place:
nothing else in the folder (a user's ``README.md``, ``notes.txt``, ``figures/``) is moved, copied or
deleted. Files of the previous save that the new one lacks are deleted, and only those: the folder's
record ``.glassbox-files.json`` (``{"owner": ..., "files": [...]}``) lists what glassbox wrote there.
A folder without a record (one written before records existed) owns only the names the caller
passes as ``adopt``; a record of another owner (an SAE's folder saved over with a model) is refused.

Why this design: a whole-folder swap (rename the old folder aside, the new one in) must copy the
user's files and has an instant with no folder at all; writing in place with a journal needs neither.

The commit, each step flushed to disk before the next:
1. every file is written to a temporary name in the folder (``.glassbox-tmp-<token>-NAME``, or a
   staging folder ``.glassbox-tmp-<token>-tree`` for ``write_tree``) and fsynced, the new record too;
2. the journal ``.glassbox-journal.json`` (itself written whole) names the renames and the
   deletions: from the instant it exists the new content wins;
3. the renames (``os.replace``), then the deletions, then the journal is removed.
``recover(folder)`` finishes an interrupted commit: with a journal it redoes steps 3 (each step
can be redone), without one it removes the ``.glassbox-tmp-*`` leftovers (the old content stands).
A ``FolderWriter`` recovers first, and so does every glassbox reader of such a folder
(``load_sae``, ``from_pretrained`` of a folder, checkpoints), so a glassbox reader never sees a
mix. Recovery may itself be killed at any instant and run again.

Footguns: a reader outside glassbox (``transformers``, SAELens) does not recover: while a commit
runs, or after a crash until the next glassbox read or write, it can see old and new files mixed.
One writer per folder at a time (no locking): a second writer's recovery would delete the first
one's temporary files. File names are flat (no ``/``) and may not start with ``.glassbox-``.
A folder path that is a regular file is refused (NotADirectoryError naming it). A folder created
for a transaction that aborts is removed again (if still empty).
"""

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Optional

from .staged import remove_tree
from .atomic import (TMP_PREFIX, set_mode, PathLike, as_os_error, fill_bytes, fill_safetensors, fill_torch, fsync_dir,
                     fsync_file, new_token, remove_quietly, temp_name, write_file)

RECORD, JOURNAL = ".glassbox-files.json", ".glassbox-journal.json"
RESERVED_PREFIX = ".glassbox-"


class FolderStateError(OSError):
    """A folder whose glassbox record or journal is damaged, or whose interrupted save cannot be finished."""


def folder_path(folder: PathLike, what: str = "write into") -> Path:
    """``folder`` absolute and its symlink followed; NotADirectoryError if it is a regular file."""
    folder = Path(os.path.abspath(os.fspath(folder)))
    if folder.is_symlink():
        folder = Path(os.path.realpath(folder))
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"cannot {what} it: it is a file, not a folder", str(folder))
    if folder == folder.parent:
        raise ValueError(f"cannot {what} the root folder {folder}")
    return folder


def check_name(name) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"a file name in a glassbox folder must be a plain name (no folders), got {name!r}")
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"file names starting with {RESERVED_PREFIX!r} are glassbox's own, got {name!r}")
    return name


def read_record(folder: PathLike) -> Optional[dict]:
    """The folder's record ``{"owner": str, "files": [names]}``, or None if it has none."""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise FolderStateError(errno.EINVAL, f"damaged glassbox record ({error}); remove it to write here again",
                               str(path)) from error
    if not (isinstance(record, dict) and isinstance(record.get("owner"), str)
            and isinstance(record.get("files"), list) and all(isinstance(n, str) for n in record["files"])):
        raise FolderStateError(errno.EINVAL, "damaged glassbox record: needs a string 'owner' and a list of "
                               "'files'; remove it to write here again", str(path))
    for name in record["files"]:
        try:
            check_name(name)
        except ValueError as error:
            raise FolderStateError(errno.EINVAL, f"damaged glassbox record: {error}", str(path)) from None
    return record


def owned_files(folder: PathLike) -> list:
    """The names the folder's record says glassbox wrote ([] without a record)."""
    record = read_record(folder)
    return [] if record is None else list(record["files"])


def recover(folder: PathLike) -> Optional[str]:
    """Finish a commit that was interrupted in ``folder``: "forward" (a journal: its renames and deletions
    done), "back" (temporary leftovers removed, the old content kept) or None (nothing to do, nothing
    written). A missing folder or a file is left alone (None). Raises FolderStateError naming the folder
    when the journal is damaged or its steps cannot be done (then a reader must not use the folder)."""
    folder = Path(os.path.abspath(os.fspath(folder)))
    try:
        entries = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return None
    journal = folder / JOURNAL
    leftovers = [e for e in entries if e.startswith(TMP_PREFIX)]
    if JOURNAL not in entries and not leftovers:
        return None
    try:
        if JOURNAL in entries:
            _replay(folder, _read_journal(journal))
            state = "forward"
        else:
            state = "back"
        _remove_leftovers(folder)
        fsync_dir(folder)
        if JOURNAL in entries:
            os.unlink(journal)
            fsync_dir(folder)
    except FolderStateError:
        raise
    except OSError as error:
        raise FolderStateError(error.errno or errno.EIO, f"an interrupted glassbox save in this folder could not "
                               f"be {'finished' if JOURNAL in entries else 'cleaned up'}: {error}",
                               str(folder)) from error
    return state


def _read_journal(journal: Path) -> dict:
    try:
        plan = json.loads(journal.read_text(encoding="utf-8"))
        renames, delete = plan["renames"], plan["delete"]
        assert all(isinstance(s, str) and isinstance(d, str) for s, d in renames)
        assert all(isinstance(n, str) for n in delete)
    except (ValueError, KeyError, TypeError, AssertionError, UnicodeDecodeError) as error:
        raise FolderStateError(errno.EINVAL, f"damaged glassbox journal ({type(error).__name__}); the save it "
                               "records cannot be finished", str(journal)) from error
    for src, dst in renames:
        if not src.startswith(TMP_PREFIX) or src.count("/") > 1 or ".." in src.split("/"):
            raise FolderStateError(errno.EINVAL, f"damaged glassbox journal: rename source {src!r}", str(journal))
    try:
        for name in [dst for _, dst in renames if dst != RECORD] + delete:
            check_name(name)
    except ValueError as error:
        raise FolderStateError(errno.EINVAL, f"damaged glassbox journal: {error}", str(journal)) from None
    return plan


def _replay(folder: Path, plan: dict) -> None:
    """Steps 3 of the commit; each can be redone (a rename whose source is gone was done)."""
    for src, dst in plan["renames"]:
        if os.path.lexists(folder / src):
            os.replace(folder / src, folder / dst)
    fsync_dir(folder)
    for name in plan["delete"]:
        path = folder / name
        if os.path.islink(path) or path.is_file():
            os.unlink(path)


def _remove_leftovers(folder: Path) -> None:
    for entry in os.listdir(folder):
        if entry.startswith(TMP_PREFIX):
            remove_tree(folder / entry)


def remove_entries(folder: PathLike, names: Iterable[str]) -> None:
    """Delete the entries ``names`` of ``folder`` (files, or folders with all they hold), one at a time;
    missing ones are skipped. Only for names the caller knows glassbox wrote there (a run folder's own
    files, checked first): this is how a writer deletes "only files it wrote itself"."""
    folder = folder_path(folder, "remove files from")
    for name in names:
        if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(f"remove_entries takes plain names, got {name!r}")
        remove_tree(folder / name)
    fsync_dir(folder)


class FolderWriter:
    """A transaction over the glassbox-owned files of ``folder`` (module docstring). ``owner`` names what
    the folder holds ("model", "sae", "checkpoint"...); ``adopt``: the names a folder without a record
    is taken to own (deleted if the new save lacks them)."""

    def __init__(self, folder: PathLike, owner: str, adopt: Iterable[str] = ()):
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"FolderWriter needs an owner name, got {owner!r}")
        self.folder = folder_path(folder)
        self.owner = owner
        self._adopt = [check_name(n) for n in adopt]
        self._token = new_token()
        self._staged = {}  # final name -> temporary path relative to the folder
        self._trees = 0
        self._created = []
        self._done = False
        recover(self.folder)
        record = read_record(self.folder) if self.folder.is_dir() else None
        if record is not None and record["owner"] != owner:
            raise ValueError(f"{self.folder} holds glassbox {record['owner']!r} files (see {RECORD}), not "
                             f"{owner!r} files; name another folder")
        self._previous = set(record["files"]) if record is not None else set(self._adopt)

    # -- writing ------------------------------------------------------------------------------------
    def _make_folder(self) -> None:
        missing = []
        path = self.folder
        while not path.exists():
            missing.append(path)
            path = path.parent
        for path in reversed(missing):
            os.mkdir(path)
            self._created.append(path)

    def _target(self, name: str) -> Path:
        self._check_open()
        check_name(name)
        target = self.folder / name
        if target.is_dir() and not target.is_symlink():
            raise IsADirectoryError(errno.EISDIR, f"cannot write the file {name}: {target} is a folder", str(target))
        self._make_folder()
        old = self._staged.pop(name, None)
        if old is not None:
            remove_quietly(self.folder / old)
        return target

    def write_file(self, name: str, fill: Callable[[Path], None]) -> Path:
        """Stage the file ``name`` with the content ``fill(tmp)`` writes at ``tmp``; returns its final path."""
        target = self._target(name)
        tmp_name = temp_name(name, self._token)
        tmp = self.folder / tmp_name
        try:
            fill(tmp)
            if not tmp.is_file():
                raise FileNotFoundError(errno.ENOENT, f"the writer of {target} wrote nothing", str(tmp))
            set_mode(target, tmp)
            fsync_file(tmp)
        except BaseException as error:
            remove_quietly(tmp)
            new = as_os_error(error, target)
            if new is error:
                raise
            raise new from error
        self._staged[name] = tmp_name
        return target

    def write_bytes(self, name: str, data: bytes) -> Path:
        return self.write_file(name, fill_bytes(data))

    def write_text(self, name: str, text: str, encoding: str = "utf-8") -> Path:
        if not isinstance(text, str):
            raise TypeError(f"write_text takes a str, got {type(text).__name__}")
        return self.write_file(name, fill_bytes(text.encode(encoding)))

    def save_torch(self, name: str, obj) -> Path:
        return self.write_file(name, fill_torch(obj))

    def save_safetensors(self, name: str, tensors: dict, metadata=None) -> Path:
        return self.write_file(name, fill_safetensors(tensors, metadata))

    def write_tree(self, fill: Callable[[Path], None]) -> list:
        """Stage every file that ``fill(tmp_folder)`` writes into an empty folder (a library's own
        ``save_pretrained``); sub-folders are refused. Returns the names staged."""
        self._check_open()
        self._make_folder()
        self._trees += 1
        tree_name = f"{TMP_PREFIX}{self._token}-tree{self._trees}"
        tree = self.folder / tree_name
        os.mkdir(tree)
        try:
            fill(tree)
            names = sorted(os.listdir(tree))
            for name in names:
                path = tree / name
                if path.is_dir() and not path.is_symlink():
                    raise ValueError(f"the writer of {self.folder} made a sub-folder {name!r}; only files are kept")
                check_name(name)
                if (self.folder / name).is_dir() and not (self.folder / name).is_symlink():
                    raise IsADirectoryError(errno.EISDIR, f"cannot write the file {name}: it is a folder",
                                            str(self.folder / name))
                set_mode(self.folder / name, path)
                fsync_file(path)
        except BaseException as error:
            shutil.rmtree(tree, ignore_errors=True)
            new = as_os_error(error, self.folder)
            if new is error:
                raise
            raise new from error
        for name in names:
            old = self._staged.pop(name, None)
            if old is not None:
                remove_quietly(self.folder / old)
            self._staged[name] = f"{tree_name}/{name}"
        return names

    # -- commit and abort ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError(f"this FolderWriter of {self.folder} has already committed or aborted")

    def commit(self) -> list:
        """Make the staged files the folder's glassbox content (module docstring); returns their names."""
        self._check_open()
        self._make_folder()
        names = sorted(self._staged)
        for name in names:  # a folder that appeared since would stop the renames halfway
            target = self.folder / name
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(errno.EISDIR, f"cannot write the file {name}: it is a folder", str(target))
        record = json.dumps({"owner": self.owner, "files": names}, indent=1) + "\n"
        record_tmp = temp_name(RECORD, self._token)
        try:
            fill_bytes(record.encode("utf-8"))(self.folder / record_tmp)
            fsync_file(self.folder / record_tmp)
            fsync_dir(self.folder)
            plan = {"owner": self.owner, "renames": [[self._staged[n], n] for n in names] + [[record_tmp, RECORD]],
                    "delete": sorted(self._previous - set(names))}
            # the commit point: once the journal is in place, recover() finishes this save
            write_file(self.folder / JOURNAL, fill_bytes(json.dumps(plan, indent=1).encode("utf-8")))
        except BaseException:
            if os.path.lexists(self.folder / JOURNAL):  # in place, but its flush failed: undo the commit point
                try:
                    os.unlink(self.folder / JOURNAL)
                except OSError:
                    self._done = True  # the staged files stay: recover() finishes this save
                    raise
            self.abort()
            raise
        self._done = True
        _replay(self.folder, plan)
        _remove_leftovers(self.folder)
        fsync_dir(self.folder)
        os.unlink(self.folder / JOURNAL)
        fsync_dir(self.folder)
        return names

    def abort(self) -> None:
        """Drop everything staged; the folder keeps its old content (a folder this writer made is removed)."""
        if self._done:
            return
        self._done = True
        for tmp in list(self._staged.values()) + [temp_name(RECORD, self._token)]:
            remove_quietly(self.folder / tmp)
        if self.folder.is_dir():
            for entry in os.listdir(self.folder):
                if entry.startswith(f"{TMP_PREFIX}{self._token}-"):
                    path = self.folder / entry
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        remove_quietly(path)
        for path in reversed(self._created):
            try:
                os.rmdir(path)
            except OSError:
                break

    def __enter__(self) -> "FolderWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False
