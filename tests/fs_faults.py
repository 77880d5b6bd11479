"""Fault injection for writers: fail, or kill the process, at the k-th file-system call, for every k.

``fail_at(k, action)`` runs ``action`` with every file-system call counted (``FS_CALLS``) and the k-th
raising an OSError before it happens; ``kill_at(k, action, after)`` runs it in a forked child that
dies (``os._exit``, no cleanup, no ``finally``) just before or just after the k-th call. Both return
whether the fault happened (False: the action made fewer calls, so the sweep is complete).

``kill_sweep(action, root, after)`` runs the whole kill sweep of ``action`` (a "module:function" of
this folder taking a folder, importing no torch) in a small subprocess that imports only
``glassbox.fs`` (forking a process that holds torch costs ~1 s per kill on two cores), killing
recovery at each of its calls too; the caller then checks the folders it left.

``folder_state(folder)`` is every file under ``folder`` (relative path -> bytes), for comparing a
folder with the old and the new content and a user's files byte for byte.
"""

import builtins
import errno
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

# Every call through which a writer touches the disk. builtins.open and io.open are one function under
# two names (pathlib uses io.open); both are counted.
FS_CALLS = [(os, "replace"), (os, "rename"), (os, "unlink"), (os, "remove"), (os, "rmdir"), (os, "mkdir"),
            (os, "makedirs"), (os, "fsync"), (os, "open"), (os, "close"), (os, "link"), (os, "chmod"),
            (os, "listdir"), (os, "scandir"), (builtins, "open"), (io, "open"), (shutil, "rmtree"),
            (shutil, "copyfile")]


class _Counter:
    def __init__(self, event: int, fault):
        self.count, self.event, self.fault = 0, event, fault

    def wrap(self, real):
        def call(*args, **kwargs):
            self.count += 1
            this = self.count
            if this == self.event:
                self.fault(before=True, name=getattr(real, "__name__", "?"), args=args)
            try:
                result = real(*args, **kwargs)
            except BaseException:  # the call happened (and failed): a kill after it still comes
                if this == self.event:
                    self.fault(before=False, name=getattr(real, "__name__", "?"), args=args)
                raise
            if this == self.event:
                self.fault(before=False, name=getattr(real, "__name__", "?"), args=args)
            return result
        return call


class _Patched:
    """Every call of FS_CALLS routed through ``counter`` until ``undo``."""

    def __init__(self, counter: _Counter):
        self.saved = [(owner, name, getattr(owner, name)) for owner, name in FS_CALLS]
        for owner, name, real in self.saved:
            setattr(owner, name, counter.wrap(real))

    def undo(self) -> None:
        for owner, name, real in self.saved:
            setattr(owner, name, real)


_patched = _Patched


class Injected(OSError):
    pass


def fail_at(event: int, action, code: int = errno.EIO):
    """Run ``action`` with the ``event``-th file-system call raising OSError(code) instead of running.
    Returns (faulted, error raised by the action or None)."""
    hit = []

    def fault(before, name, args):
        if before:
            hit.append(name)
            raise Injected(code, f"injected fault in {name}", str(args[0]) if args else None)

    counter = _Counter(event, fault)
    mp = _patched(counter)
    error = None
    try:
        action()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        error = e
    finally:
        mp.undo()
    return bool(hit), error


def kill_at(event: int, action, after: bool = False) -> bool:
    """Run ``action`` in a forked child that dies at its ``event``-th file-system call (before it, or
    after it returns). True if it died there; False if the action finished first."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest cleanup, no finally blocks after the kill
        try:
            def fault(before, name, args):
                if before != after:
                    os._exit(17)

            _patched(_Counter(event, fault))
            action()
        except BaseException:  # noqa: BLE001
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 17), f"the child failed (exit {code}) at event {event}"
    return code == 17


def folder_state(folder: Path) -> dict:
    """relative path -> bytes of every file under ``folder`` (symlinks as their target text)."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[rel] = b"->" + os.readlink(path).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


# -- the kill sweep in a small process ---------------------------------------------------------------
_LIGHT = ("import sys, types, json; g = types.ModuleType('glassbox'); g.__path__ = [{pkg!r}]; "
          "sys.modules['glassbox'] = g; sys.path.insert(0, {tests!r}); import fs_faults; "
          "print(json.dumps(fs_faults._sweep(*json.loads(sys.argv[1]))))")


def kill_sweep(action: str, root: Path, after: bool, recovery: bool = True) -> list:
    """Copy ``root/template`` to ``root/K`` and kill ``action(root/K)`` at its K-th call, for every K until
    it finishes (``root/done`` then holds its completed result); with ``recovery``, also copy each
    killed folder with leftovers to ``root/K-J`` and kill ``glassbox.fs.recover`` at its J-th call.
    Returns [{"folder", "event", "inner", "leftovers"}] for the caller to check (after recovering)."""
    import json
    import subprocess
    import sys

    tests = str(Path(__file__).resolve().parent)
    pkg = str(Path(__file__).resolve().parent.parent / "glassbox")
    code = _LIGHT.format(pkg=pkg, tests=tests)
    out = subprocess.run([sys.executable, "-c", code, json.dumps([action, str(root), after, recovery])],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": tests})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sweep(action: str, root: str, after: bool, recovery: bool) -> list:
    import importlib

    from glassbox.fs import recover

    module, name = action.split(":")
    act = getattr(importlib.import_module(module), name)
    root = Path(root)
    found, event, swept = [], 1, set()
    while True:
        folder = root / str(event)
        shutil.copytree(root / "template", folder, symlinks=True)
        if not kill_at(event, lambda: act(folder / "out"), after):
            os.rename(folder, root / "done")
            break
        leftovers = sorted(e for e in os.listdir(folder / "out") if e.startswith(".glassbox-")
                           and e != ".glassbox-files.json") if (folder / "out").is_dir() else []
        found.append({"folder": str(folder / "out"), "event": event, "inner": None, "leftovers": leftovers})
        # recovery killed at each call, once per distinct state on disk (names with the token masked)
        key = tuple(sorted(re.sub(r"\.glassbox-tmp-[0-9a-f]{12}-", ".glassbox-tmp-T-", e)
                           for e in os.listdir(folder / "out"))) if leftovers else None
        inner = 1
        while recovery and leftovers and key not in swept:
            copy = root / f"{event}-{inner}"
            shutil.copytree(folder, copy, symlinks=True)
            died = kill_at(inner, lambda: recover(copy / "out"), after)
            found.append({"folder": str(copy / "out"), "event": event, "inner": inner, "leftovers": leftovers})
            if not died:
                swept.add(key)
                break
            inner += 1
        event += 1
    return found


def fast_tmp(tmp_path: Path) -> Path:
    """A folder on tmpfs (/dev/shm) where there is one: each fsync there costs microseconds, not
    milliseconds, so a sweep of a thousand saves takes seconds. The caller removes it."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="glassbox-faults-", dir=shm))
    return tmp_path
