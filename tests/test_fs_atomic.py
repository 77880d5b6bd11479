"""Single files written whole (glassbox.fs.atomic), tested the way they fail: a fault at each
file-system call in turn, a kill before and after each call, a full disk (``RLIMIT_FSIZE`` in a
subprocess, and ENOSPC from the file's write), a folder or a link where the file goes."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fs_faults import fail_at, fast_tmp, kill_sweep
from glassbox.fs import TMP_PREFIX, append_text, as_os_error, recover, save_torch, write_bytes, write_file, write_text
from glassbox.fs import atomic

OLD, NEW = b"old content " * 50, b"the new content, longer " * 80
USER = {"README.md": b"mine", "notes.txt.glassbox": b"also mine", "f.bin.bak": b"a look-alike", ".f.bin.swp": b"an editor file"}


@pytest.fixture
def sweep_dir(tmp_path):
    path = fast_tmp(tmp_path)
    yield path
    if path != tmp_path:
        shutil.rmtree(path, ignore_errors=True)


def setup_old(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "f.bin").write_bytes(OLD)
    for name, data in USER.items():
        (folder / name).write_bytes(data)
    return folder / "f.bin"


def others(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "f.bin"}


def test_a_fault_at_any_call_leaves_the_old_or_the_new_file_and_names_it(sweep_dir):
    seen, event = set(), 1
    while True:
        path = setup_old(sweep_dir / str(event))
        faulted, error = fail_at(event, lambda: write_bytes(path, NEW))
        if not faulted:
            break
        assert isinstance(error, OSError) and error.filename == str(path), f"event {event}: {error!r}"
        assert str(path) in str(error)
        data = path.read_bytes()
        assert data in (OLD, NEW), f"event {event}: a mix"
        assert others(path.parent) == USER, f"event {event}: a leftover or a user's file changed"
        seen.add(data == NEW)
        event += 1
    assert event > 4 and seen == {False, True}, (event, seen)


def write_new(folder: Path) -> None:  # run by the kill sweep's small process
    write_bytes(folder / "f.bin", NEW)


@pytest.mark.parametrize("after", [False, True])
def test_a_kill_at_any_call_leaves_the_old_or_the_new_file_and_the_next_write_cleans_up(sweep_dir, after):
    setup_old(sweep_dir / "template" / "out")
    found = kill_sweep("test_fs_atomic:write_new", sweep_dir, after, recovery=False)
    assert len(found) > 4
    seen = set()
    for f in found:
        folder = Path(f["folder"])
        data = (folder / "f.bin").read_bytes()
        assert data in (OLD, NEW), f
        seen.add(data == NEW)
        if f["event"] % 2:  # the next write of the same file removes the leftover
            write_bytes(folder / "f.bin", OLD)
        else:  # and so does recover of the folder
            recover(folder)
        assert others(folder) == USER, f
    assert seen == {False, True}


def test_a_full_disk_is_an_os_error_naming_the_file_and_the_old_content_stays(tmp_path):
    """RLIMIT_FSIZE makes every write past 64 KiB fail with EFBIG, as a full disk fails with ENOSPC:
    torch.save would raise '[enforce fail at inline_container.cc]', safetensors a SafetensorError."""
    script = """
import json, os, resource, signal, sys, torch
from pathlib import Path
from glassbox.fs import FolderWriter, save_safetensors, save_torch, write_bytes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
root = Path(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
big = {"w": torch.zeros(40000)}
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = None
    except BaseException as e:
        out[name] = [type(e).__name__, getattr(e, "errno", None), getattr(e, "filename", None), str(e)]
attempt("bytes", lambda: write_bytes(root / "a.bin", b"x" * 200000))
attempt("torch", lambda: save_torch(root / "b.pt", big))
attempt("safetensors", lambda: save_safetensors(root / "c.safetensors", big))
def folder():
    with FolderWriter(root / "sae", "test") as w:
        w.write_bytes("cfg.json", b"{}")
        w.save_safetensors("w.safetensors", big)
attempt("folder", folder)
print(json.dumps(out))
"""
    for name in ("a.bin", "b.pt", "c.safetensors"):
        (tmp_path / name).write_bytes(OLD)
    from glassbox.fs import FolderWriter

    with FolderWriter(tmp_path / "sae", "test") as w:
        w.write_bytes("cfg.json", b'{"old": 1}')
    (tmp_path / "sae" / "README.md").write_bytes(b"mine")
    before = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name, file in (("bytes", "a.bin"), ("torch", "b.pt"), ("safetensors", "c.safetensors"),
                       ("folder", "sae/w.safetensors")):
        kind, code, filename, message = out[name]
        assert kind == "OSError" and code == errno.EFBIG, (name, out[name])
        assert filename == str(tmp_path / file) and "File too large" in message, (name, out[name])
        assert "enforce fail" not in message.split("(writing")[0], message
    after = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "a full disk changed a file or left a temporary one"


def test_enospc_from_torch_s_writer_is_the_os_error_naming_the_file(tmp_path, monkeypatch):
    import torch

    path = tmp_path / "state.pt"
    path.write_bytes(OLD)
    real_open = open

    class Full:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(atomic, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    with pytest.raises(OSError) as info:
        save_torch(path, {"w": torch.zeros(10000)})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert "No space left on device" in str(info.value) and isinstance(info.value.__cause__, RuntimeError)
    assert path.read_bytes() == OLD and sorted(os.listdir(tmp_path)) == ["state.pt"]


def test_as_os_error_keeps_the_errno_of_torch_and_safetensors_failures(tmp_path):
    path = str(tmp_path / "x")
    plain = as_os_error(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), path)
    assert isinstance(plain, OSError) and plain.errno == errno.EIO and plain.filename == path
    assert "inline_container" in str(plain)
    class SafetensorError(Exception):
        pass
    st = as_os_error(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), path)
    assert st.errno == errno.ENOSPC and st.filename == path
    other = ValueError("not a write failure")
    assert as_os_error(other, path) is other and as_os_error(KeyboardInterrupt(), path).__class__ is KeyboardInterrupt
    denied = as_os_error(PermissionError(errno.EACCES, "Permission denied", path + ".tmp"), path)
    assert isinstance(denied, PermissionError) and denied.filename == path


def test_a_folder_where_the_file_goes_is_refused_naming_it(tmp_path):
    (tmp_path / "out.html").mkdir()
    (tmp_path / "out.html" / "keep").write_bytes(b"k")
    with pytest.raises(IsADirectoryError, match="out.html"):
        write_text(tmp_path / "out.html", "<html>")
    assert (tmp_path / "out.html" / "keep").read_bytes() == b"k" and sorted(os.listdir(tmp_path)) == ["out.html"]


def test_a_link_is_followed_and_kept_and_permissions_are_kept(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    (tmp_path / "link.txt").symlink_to(target)
    write_text(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and target.read_text() == "new"
    assert os.stat(target).st_mode & 0o777 == 0o640
    fresh = write_text(tmp_path / "sub" / "dir" / "new.txt", "made")  # parents made
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.read_text() == "made" and os.stat(fresh).st_mode & 0o777 == 0o666 & ~umask


def test_a_writer_that_fails_or_writes_nothing_leaves_the_old_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(OLD)

    def half(tmp):
        tmp.write_bytes(b"half")
        raise ValueError("the writer's own error")

    with pytest.raises(ValueError, match="own error"):
        write_file(path, half)
    with pytest.raises(FileNotFoundError, match="wrote nothing"):
        write_file(path, lambda tmp: None)
    assert path.read_bytes() == OLD and os.listdir(tmp_path) == ["f"]
    with pytest.raises(TypeError, match="bytes"):
        write_bytes(path, "text")
    with pytest.raises(TypeError, match="str"):
        write_text(path, b"bytes")


def test_a_long_name_and_leftovers_of_other_files_are_handled(tmp_path):
    long = tmp_path / ("n" * 240)
    write_text(long, "a")
    write_text(long, "b")
    assert long.read_text() == "b" and os.listdir(tmp_path) == [long.name]
    (tmp_path / f"{TMP_PREFIX}0123456789ab-other.txt").write_bytes(b"leftover of another file")
    write_text(tmp_path / "mine.txt", "m")  # another file's leftover is that file's to clean
    assert (tmp_path / f"{TMP_PREFIX}0123456789ab-other.txt").exists()
    write_text(tmp_path / "other.txt", "o")
    assert not (tmp_path / f"{TMP_PREFIX}0123456789ab-other.txt").exists()


def test_append_text_appends_and_names_a_folder(tmp_path):
    append_text(tmp_path / "log.jsonl", "1\n")
    append_text(tmp_path / "log.jsonl", "2\n")
    assert (tmp_path / "log.jsonl").read_text() == "1\n2\n"
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        append_text(tmp_path, "x")


def test_open_log_starts_fresh_whole_or_appends(tmp_path):
    from glassbox.fs import open_log

    path = tmp_path / "train_log.jsonl"
    path.write_text("old line\n")
    with open_log(path) as log:
        log.write("appended\n")
    assert path.read_text() == "old line\nappended\n"
    with open_log(path, fresh=True) as log:
        log.write("first\n")
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["train_log.jsonl"]
    with pytest.raises(IsADirectoryError):
        open_log(tmp_path)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_new_file_gets_the_umask_mode_whatever_its_writer_used(tmp_path, umask):
    """safetensors' writer creates 0o600 files; a new file glassbox writes has 0o666 less the umask, as
    a plain open() would give it, and a replaced file keeps its own bits."""
    import importlib
    from glassbox.fs import atomic, folder

    old = os.umask(umask)
    try:
        importlib.reload(atomic)  # the umask is read at import (folder's set_mode reads the same globals)
        new = atomic.save_safetensors(tmp_path / "a.safetensors", {"w": torch.zeros(2)})
        assert os.stat(new).st_mode & 0o777 == 0o666 & ~umask
        os.chmod(new, 0o604)
        atomic.save_safetensors(new, {"w": torch.ones(2)})
        assert os.stat(new).st_mode & 0o777 == 0o604
        with folder.FolderWriter(tmp_path / "run", "sae") as writer:
            writer.save_safetensors("b.safetensors", {"w": torch.zeros(2)})
        assert os.stat(tmp_path / "run" / "b.safetensors").st_mode & 0o777 == 0o666 & ~umask
    finally:
        os.umask(old)
        importlib.reload(atomic)
