"""glassbox.fs.staged: a folder computed apart and renamed into place, and removal of glassbox's own entries."""

import os

import pytest

from glassbox.fs import staged
from glassbox.fs.staged import commit_staged, discard_tree, remove_empty_dir, remove_tree


def make_staged(root, files):
    folder = root / ".tmp" / "shard_00000.abc"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def contents(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_commit_renames_the_whole_folder_and_flushes_every_file(tmp_path, monkeypatch):
    files = {"values.safetensors": b"v" * 10, "sub/meta.json": b"{}"}
    src = make_staged(tmp_path, files)
    synced = []
    real = staged.fsync_file
    monkeypatch.setattr(staged, "fsync_file", lambda p: (synced.append(os.fspath(p)), real(p)))
    final = commit_staged(src, tmp_path / "shards" / "shard_00000")
    assert contents(final) == files and not src.exists()
    assert sorted(os.path.relpath(p, src) for p in synced) == ["sub/meta.json", "values.safetensors"]


def test_a_leftover_final_is_replaced_whole(tmp_path):
    final = tmp_path / "shards" / "shard_00000"
    final.mkdir(parents=True)
    (final / "stale.bin").write_bytes(b"old")
    commit_staged(make_staged(tmp_path, {"new.bin": b"new"}), final)
    assert contents(final) == {"new.bin": b"new"}


@pytest.mark.parametrize("where", ["fsync_file", "fsync_dir", "replace"])
def test_a_failure_before_the_rename_leaves_the_staged_folder_and_no_final(tmp_path, monkeypatch, where):
    files = {"a.bin": b"a", "b.bin": b"b"}
    src = make_staged(tmp_path, files)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if where == "replace":
        monkeypatch.setattr(staged.os, "replace", fail)
    else:
        monkeypatch.setattr(staged, where, fail)
    final = tmp_path / "shards" / "shard_00000"
    with pytest.raises(OSError, match="No space"):
        commit_staged(src, final)
    assert contents(src) == files and not final.exists()


def test_a_staged_path_that_is_no_folder_is_refused_by_name(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a staged folder"):
        commit_staged(tmp_path / "f", tmp_path / "final")
    with pytest.raises(NotADirectoryError, match="missing"):
        commit_staged(tmp_path / "missing", tmp_path / "final")


def test_remove_empty_dir_keeps_a_folder_holding_anything(tmp_path):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    assert remove_empty_dir(tmp_path / "kept") is False and (tmp_path / "kept" / "notes.txt").read_text() == "mine"
    assert remove_empty_dir(tmp_path / "empty") is True and not (tmp_path / "empty").exists()
    assert remove_empty_dir(tmp_path / "missing") is False


def test_remove_tree_of_a_link_removes_the_link_only(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("k")
    (tmp_path / "link").symlink_to(target)
    remove_tree(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and (target / "keep.txt").read_text() == "k"
    remove_tree(tmp_path / "missing")  # missing is fine


def test_discard_tree_swallows_the_os_error_of_a_cleanup(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()

    def fail(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(staged.shutil, "rmtree", fail)
    discard_tree(tmp_path / "d")  # no raise: the failure being handled stays the one raised
    assert (tmp_path / "d").is_dir()
