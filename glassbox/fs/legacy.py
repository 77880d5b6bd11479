"""Recovering what the savers of earlier glassbox versions left beside a folder when killed mid-swap.

Those savers replaced a whole folder by renaming it aside and a new one in; killed between the two
renames they left no folder, the old one under a sibling name. Each scheme had its own names, so
each has its own function, called only for folders that scheme wrote (a user's ``out.old`` beside a
model folder is not a checkpoint's leftover):

- ``recover_checkpoint_siblings``: ``NAME.new`` (complete: it wins), ``NAME.old`` (the old one, put
  back if ``NAME`` is missing), ``NAME.tmp`` (incomplete: removed);
- ``recover_export_siblings`` (``save_pretrained``): ``NAME.glassbox-old-XXXXXXXX`` (the newest put back
  if ``NAME`` is missing, the others removed) and ``NAME.glassbox-tmp-XXXXXXXX`` (removed);
- ``recover_sae_siblings`` (``save_sae``): ``.NAME.XXXXXXXX.old/NAME`` (put back if ``NAME`` is missing)
  and ``.NAME.XXXXXXXX.tmp`` (removed).

Each returns True if it put a folder back. Every step is one rename or one removal of a sibling
glassbox named, so a recovery killed midway is finished by the next one.
"""

import os
import re
import shutil
from pathlib import Path

from .atomic import PathLike, fsync_dir


def _siblings(folder: Path, pattern: str) -> list:
    try:
        entries = os.listdir(folder.parent)
    except FileNotFoundError:
        return []
    rx = re.compile(pattern)
    return sorted(folder.parent / e for e in entries if rx.fullmatch(e) and (folder.parent / e).is_dir()
                  and not (folder.parent / e).is_symlink())


def recover_checkpoint_siblings(folder: PathLike) -> bool:
    folder = Path(os.path.abspath(os.fspath(folder)))
    new, old, tmp = (folder.with_name(folder.name + s) for s in (".new", ".old", ".tmp"))
    restored = False
    if new.is_dir():  # complete: finish its swap
        if folder.is_dir():
            if old.exists():
                shutil.rmtree(old)
            os.rename(folder, old)
        os.rename(new, folder)
        fsync_dir(folder.parent)
        restored = True
    elif old.is_dir() and not folder.exists():
        os.rename(old, folder)  # its NAME.tmp may be incomplete, the old checkpoint is not
        fsync_dir(folder.parent)
        restored = True
    for leftover in (old, tmp):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
    return restored


def recover_export_siblings(folder: PathLike) -> bool:
    folder = Path(os.path.abspath(os.fspath(folder)))
    name = re.escape(folder.name)
    olds = _siblings(folder, name + r"\.glassbox-old-[0-9a-f]{8}")
    olds.sort(key=lambda p: p.stat().st_mtime)
    restored = False
    if not folder.exists() and olds:
        os.rename(olds.pop(), folder)
        fsync_dir(folder.parent)
        restored = True
    for leftover in olds + _siblings(folder, name + r"\.glassbox-tmp-[0-9a-f]{8}"):
        shutil.rmtree(leftover)
    return restored


def recover_sae_siblings(folder: PathLike) -> bool:
    folder = Path(os.path.abspath(os.fspath(folder)))
    name = re.escape(folder.name)
    olds = [p for p in _siblings(folder, r"\." + name + r"\.[A-Za-z0-9_]{8}\.old")]
    restored = False
    for old in sorted(olds, key=lambda p: p.stat().st_mtime, reverse=True):
        inner = old / folder.name
        if not folder.exists() and inner.is_dir():
            os.rename(inner, folder)
            fsync_dir(folder.parent)
            restored = True
    for leftover in olds + _siblings(folder, r"\." + name + r"\.[A-Za-z0-9_]{8}\.tmp"):
        shutil.rmtree(leftover)
    return restored
