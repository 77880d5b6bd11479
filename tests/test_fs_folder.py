"""FolderWriter, tested the way it fails: a fault raised at each file-system call in turn, the process
killed before and after each call (a forked child and ``os._exit``), recovery itself killed at each of
its calls, and a user's files in the folder first. Afterwards (after ``recover``) the folder holds the
old content or the new, never a mix, its record names exactly that content, nothing of the writer's is
left behind, and the user's files are there byte for byte."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from fs_faults import fail_at, fast_tmp, folder_state, kill_sweep
from glassbox.fs import JOURNAL, RECORD, TMP_PREFIX, FolderStateError, FolderWriter, owned_files, read_record, recover


@pytest.fixture
def sweep_dir(tmp_path):
    path = fast_tmp(tmp_path)
    yield path
    if path != tmp_path:
        shutil.rmtree(path, ignore_errors=True)

OLD = {"a.json": b'{"old": 1}', "b.bin": b"B1" * 100, "c.txt": b"only in the old save"}
NEW = {"a.json": b'{"new": 22}', "b.bin": b"B2" * 150, "d.txt": b"only in the new save"}
USER = {"README.md": b"# my notes on this model\n", "notes.txt": b"\x00\xffbinary notes", "figures/x.png": b"\x89PNG\r\n",
        "model-backup.safetensors": b"a look-alike of a glassbox file", "c.txt.bak": b"user copy"}


def save(folder: Path, content: dict, owner: str = "test", adopt=()) -> None:
    """Half the files through write_bytes, half through write_tree (as save_pretrained stages a folder)."""
    names = sorted(content)
    with FolderWriter(folder, owner, adopt=adopt) as w:
        w.write_bytes(names[0], content[names[0]])

        def tree(tmp: Path) -> None:
            for name in names[1:]:
                with open(tmp / name, "wb") as handle:
                    handle.write(content[name])
        w.write_tree(tree)


def make_old(folder: Path) -> None:
    save(folder, OLD)
    for rel, data in USER.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def which(folder: Path, fresh: bool = False, recovered: bool = True) -> str:
    """'old' or 'new' after recovery; fails on a mix, a leftover, a wrong record or a changed user file."""
    if recovered:
        recover(folder)
    assert not [e for e in os.listdir(folder) if e.startswith(".glassbox-") and e != RECORD] if folder.is_dir() \
        else True, sorted(os.listdir(folder))
    state = folder_state(folder)
    user = {rel: state.pop(rel) for rel in list(state) if rel in USER}
    assert user == ({} if fresh else USER), "a user's file changed, vanished or appeared"
    record = state.pop(RECORD, None)
    if fresh and not state and record is None:
        return "old"
    assert record is not None and json.loads(record) == {"owner": "test", "files": sorted(state)}, record
    if state == NEW:
        return "new"
    assert state == OLD, f"a mix of the old and new saves: {sorted(state)}"
    return "old"


@pytest.mark.parametrize("fresh", [False, True])
def test_a_fault_at_any_call_leaves_the_old_or_the_new_content(sweep_dir, fresh):
    tmp_path = sweep_dir
    seen, event = set(), 1
    while True:
        folder = tmp_path / str(event) / "out"
        if not fresh:
            make_old(folder)
        faulted, error = fail_at(event, lambda: save(folder, NEW))
        if not faulted:
            assert error is None
            break
        assert isinstance(error, OSError), f"event {event}: {error!r}"
        if not (folder / JOURNAL).exists():  # failed before its commit point or after its end: clean already
            if which(folder, fresh, recovered=False) == "old" and fresh:
                assert not folder.exists(), f"event {event}: the folder the failed save made is left"
        seen.add(which(folder, fresh))
        save(folder, NEW)  # and the next save works
        assert which(folder, fresh) == "new"
        event += 1
    assert event > 20, "the save made fewer file-system calls than expected: is the harness counting?"
    assert seen == {"old", "new"}, seen


def save_new(folder: Path) -> None:  # run by the kill sweep's small process
    save(folder, NEW)


@pytest.mark.parametrize("fresh", [False, True])
@pytest.mark.parametrize("after", [False, True])
def test_a_kill_at_any_call_then_a_kill_at_any_call_of_recovery(sweep_dir, after, fresh):
    tmp_path = sweep_dir
    (tmp_path / "template").mkdir()
    if not fresh:
        make_old(tmp_path / "template" / "out")
    found = kill_sweep("test_fs_folder:save_new", tmp_path, after)
    events = {f["event"] for f in found}
    assert len(events) > 20, "the save made fewer file-system calls than expected: is the harness counting?"
    assert any(f["inner"] and f["inner"] > 3 for f in found), "recovery was killed at few of its calls"
    seen = set()
    for f in found:
        folder = Path(f["folder"])
        if not folder.exists():
            assert fresh, f
            continue
        state = which(folder, fresh)
        if f["inner"] is None:
            seen.add((state, JOURNAL in f["leftovers"]))
    assert which(tmp_path / "done" / "out", fresh) == "new"
    # killed once its journal is in place the new content wins; before it, the old one
    assert ("old", False) in seen and ("new", True) in seen and ("old", True) not in seen, seen


def test_only_files_the_previous_record_names_are_deleted(tmp_path):
    folder = tmp_path / "out"
    make_old(folder)
    save(folder, NEW)
    assert which(folder) == "new"
    assert owned_files(folder) == sorted(NEW)
    # a folder written before records existed: only the adopted names are glassbox's
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for rel, data in {**OLD, **USER}.items():
        (legacy / rel).parent.mkdir(parents=True, exist_ok=True)
        (legacy / rel).write_bytes(data)
    save(legacy, NEW, adopt=("c.txt",))
    assert which(legacy) == "new"
    save(tmp_path / "legacy2", OLD)
    os.unlink(tmp_path / "legacy2" / RECORD)
    save(tmp_path / "legacy2", NEW)  # nothing adopted: the old c.txt is not known to be glassbox's, so it stays
    assert folder_state(tmp_path / "legacy2")["c.txt"] == OLD["c.txt"]


def test_an_error_inside_the_block_leaves_the_old_content_and_no_new_folder(tmp_path):
    folder = tmp_path / "out"
    make_old(folder)
    with pytest.raises(KeyError):
        with FolderWriter(folder, "test") as w:
            w.write_bytes("a.json", b"half")
            raise KeyError("boom")
    assert which(folder) == "old"
    fresh = tmp_path / "x" / "y" / "out"
    with pytest.raises(KeyError):
        with FolderWriter(fresh, "test") as w:
            w.write_bytes("a.json", b"half")
            raise KeyError("boom")
    assert not (tmp_path / "x").exists(), "the folders the aborted writer made are left"


def test_a_folder_path_that_is_a_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"a user's file")
    with pytest.raises(NotADirectoryError, match="out"):
        FolderWriter(path, "test")
    assert path.read_bytes() == b"a user's file"
    assert recover(path) is None and path.read_bytes() == b"a user's file"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../up", "a\\b", RECORD, JOURNAL, TMP_PREFIX + "x", "n\0ul"])
def test_a_bad_file_name_is_refused(tmp_path, name):
    with FolderWriter(tmp_path / "out", "test") as w:
        with pytest.raises(ValueError, match="name"):
            w.write_bytes(name, b"x")
    assert folder_state(tmp_path / "out") == {RECORD: b'{\n "owner": "test",\n "files": []\n}\n'}


def test_a_user_folder_where_a_file_goes_is_refused_and_nothing_changes(tmp_path):
    folder = tmp_path / "out"
    make_old(folder)
    with pytest.raises(IsADirectoryError, match="figures"):
        with FolderWriter(folder, "test") as w:
            w.write_bytes("a.json", b"new")
            w.write_bytes("figures", b"x")
    assert which(folder) == "old"
    with pytest.raises(IsADirectoryError, match="figures"):
        save(folder, {"a.json": b"1", "figures": b"2"})
    assert which(folder) == "old"


def test_another_owner_is_refused(tmp_path):
    folder = tmp_path / "out"
    make_old(folder)
    with pytest.raises(ValueError, match="'test' files.*not 'sae'"):
        FolderWriter(folder, "sae")
    assert which(folder) == "old"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"owner": "test"}', '{"owner": "test", "files": [3]}',
                                  '{"owner": "test", "files": ["../../escape"]}', '{"owner": 5, "files": []}'])
def test_a_damaged_record_is_refused_naming_it(tmp_path, text):
    folder = tmp_path / "out"
    make_old(folder)
    (folder / RECORD).write_text(text)
    before = folder_state(folder)
    with pytest.raises(FolderStateError, match=RECORD):
        save(folder, NEW)
    with pytest.raises(FolderStateError, match=RECORD):
        read_record(folder)
    assert folder_state(folder) == before


@pytest.mark.parametrize("text", ["{not json", '{"renames": [["a", "b"]], "delete": []}',
                                  '{"renames": [], "delete": ["../x"]}', '{"renames": []}',
                                  '{"renames": [[".glassbox-tmp-x/../../y", "a.json"]], "delete": []}'])
def test_a_damaged_journal_is_refused_naming_it_and_nothing_is_done(tmp_path, text):
    folder = tmp_path / "out"
    make_old(folder)
    (folder / JOURNAL).write_text(text)
    before = folder_state(folder)
    with pytest.raises(FolderStateError, match=JOURNAL):
        recover(folder)
    with pytest.raises(FolderStateError, match=JOURNAL):
        save(folder, NEW)
    assert folder_state(folder) == before


def test_recovery_that_cannot_finish_is_refused_naming_the_folder(tmp_path, monkeypatch):
    folder = tmp_path / "out"
    make_old(folder)
    (folder / JOURNAL).write_text(json.dumps({"renames": [[TMP_PREFIX + "gone", "a.json"]], "delete": ["c.txt"]}))
    real = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p, *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no")))
    with pytest.raises(FolderStateError, match="could not be finished") as info:
        recover(folder)
    assert info.value.filename == str(folder)
    monkeypatch.setattr(os, "unlink", real)
    recover(folder)
    assert not (folder / "c.txt").exists() and not (folder / JOURNAL).exists()


def test_a_symlinked_folder_is_written_through_and_the_link_kept_and_modes_kept(tmp_path):
    real = tmp_path / "real"
    make_old(real)
    os.chmod(real / "a.json", 0o600)
    os.chmod(real / "b.bin", 0o640)
    (tmp_path / "link").symlink_to(real)
    save(tmp_path / "link", NEW)
    assert (tmp_path / "link").is_symlink() and which(real) == "new"
    assert os.stat(real / "a.json").st_mode & 0o777 == 0o600 and os.stat(real / "b.bin").st_mode & 0o777 == 0o640


def test_the_same_name_twice_keeps_the_last_and_leaves_nothing(tmp_path):
    with FolderWriter(tmp_path / "out", "test") as w:
        w.write_bytes("a", b"1")
        w.write_bytes("a", b"2")
        w.write_tree(lambda t: (t / "a").write_bytes(b"3"))
    assert folder_state(tmp_path / "out") == {RECORD: b'{\n "owner": "test",\n "files": [\n  "a"\n ]\n}\n', "a": b"3"}
    with pytest.raises(RuntimeError, match="already committed"):
        w.write_bytes("b", b"x")


def test_a_sub_folder_from_write_tree_is_refused(tmp_path):
    folder = tmp_path / "out"
    make_old(folder)
    with pytest.raises(ValueError, match="sub-folder 'deep'"):
        with FolderWriter(folder, "test") as w:
            w.write_tree(lambda t: (t / "deep").mkdir())
    assert which(folder) == "old"


def test_recover_of_a_clean_or_missing_folder_writes_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "out"
    make_old(folder)
    for name in ("replace", "unlink", "rename", "mkdir", "rmdir"):
        monkeypatch.setattr(os, name, lambda *a, **k: pytest.fail("recover wrote to a clean folder"))
    assert recover(folder) is None and recover(tmp_path / "missing") is None
