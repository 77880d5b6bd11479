"""Folders written whole under a private staging name, then renamed into place; and removal of glassbox's own
entries.

``commit_staged(staged, final)`` is for output made of a whole folder computed apart (a scale job's
shard: ``.tmp/shard_XXXXX.<id>/`` becomes ``shards/shard_XXXXX/``): every file in ``staged`` is flushed to
disk, ``staged`` is renamed to ``final`` (one ``os.replace``, atomic on POSIX) and the parent's entry is
flushed. A ``final`` already there is an uncommitted leftover of the caller's own (its record was never
written) and is removed first; the caller's record (a scale manifest) is the commit point, so a
``final`` the record does not name is never read.

``remove_tree(path)`` deletes a file or a folder with all it holds, and ``remove_empty_dir(path)`` a folder
only when it is empty. Both are only for paths the caller knows glassbox made (staging folders, shards its
record names, probes): this is how a writer deletes "only what it wrote itself". Errors of the OS surface
as ``OSError`` naming the path.
"""

import os
import shutil
from pathlib import Path

from .atomic import PathLike, fsync_dir, fsync_file


def sync_tree(folder: PathLike) -> None:
    """Flush every regular file under ``folder`` (links are not followed) and the folder's own entries."""
    folder = Path(folder)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fsync_file(path)
    fsync_dir(folder)


def remove_tree(path: PathLike) -> None:
    """Delete ``path``: a folder with all it holds (a link to a folder: the link only), or a file; missing is fine."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def remove_empty_dir(path: PathLike) -> bool:
    """Delete the folder ``path`` if it exists and holds nothing; True when it was removed."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        path.rmdir()
        return True
    return False


def commit_staged(staged: PathLike, final: PathLike) -> Path:
    """Flush ``staged`` and rename it to ``final`` (a leftover ``final`` of the caller's is replaced)."""
    staged, final = Path(staged), Path(final)
    if not staged.is_dir() or staged.is_symlink():
        raise NotADirectoryError(f"{staged} is not a staged folder")
    sync_tree(staged)
    final.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(final):
        remove_tree(final)
    os.replace(staged, final)
    fsync_dir(final.parent)
    return final


def discard_tree(path: PathLike) -> None:
    """``remove_tree`` for cleanup after a failure: an error of the OS is swallowed (the next run's debris
    removal takes what is left), so that the failure being handled is the one raised."""
    try:
        remove_tree(path)
    except OSError:
        pass
