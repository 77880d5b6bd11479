"""Output folders: glassbox resumes only a folder it wrote, refuses damaged or foreign manifests, and never
deletes what it did not write; a successful run leaves no ``.tmp/``.

Every refusal is checked against a byte-for-byte snapshot of the folder taken before the call: a refused
run changes nothing. The job here is test_scale_job's Squares (no model: its values are hand computations).
"""

import json
import os
from pathlib import Path

import pytest

from glassbox.scale import Manifest, load_manifest, run_job, verify

from test_scale_job import SQUARES, Squares  # noqa: E402


def snapshot(folder: Path) -> dict:
    """Every file (bytes) and folder under ``folder``, by relative path."""
    out = {}
    for path in sorted(Path(folder).rglob("*")):
        name = path.relative_to(folder).as_posix()
        out[name] = "<dir>" if path.is_dir() else path.read_bytes()
    return out


def user_folder(root: Path, *inside: str) -> Path:
    """A user's folder holding nothing but the named glassbox-looking subfolders, with the user's files in them."""
    folder = root / "mine"
    folder.mkdir()
    for sub in inside:
        (folder / sub).mkdir()
        (folder / sub / "data.bin").write_bytes(os.urandom(64))
    return folder


@pytest.mark.parametrize("inside", [("shards",), (".tmp",), ("shards", ".tmp")])
def test_resume_into_a_folder_without_glassboxs_manifest_is_refused_untouched(tmp_path, inside):
    folder = user_folder(tmp_path, *inside)
    before = snapshot(folder)
    with pytest.raises(FileExistsError, match="holds no glassbox job"):
        run_job(Squares(), folder, model=object(), progress=False, resume=True)
    assert snapshot(folder) == before


def test_a_folder_holding_only_empty_glassbox_names_is_refused(tmp_path):
    folder = tmp_path / "out"
    (folder / "shards").mkdir(parents=True)
    (folder / ".tmp").mkdir()
    with pytest.raises(FileExistsError, match="not empty"):
        run_job(Squares(), folder, model=object(), progress=False, resume=True)
    assert snapshot(folder) == {"shards": "<dir>", ".tmp": "<dir>"}


def finished(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    assert run_job(Squares(), out, model=object(), progress=False) == SQUARES
    return out


def rewrite(out: Path, change) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


DAMAGE = {
    "not json": (lambda out: (out / "manifest.json").write_text('{"format": "glassbox-scale'), "not valid JSON"),
    "a list": (lambda out: (out / "manifest.json").write_text("[1, 2]"), "JSON list, not an object"),
    "shards a list": (lambda out: rewrite(out, lambda m: m.__setitem__("shards", [])), "'shards' must be"),
    "plan of strings": (lambda out: rewrite(out, lambda m: m.__setitem__("plan", ["0 0 3"])), "'plan'"),
    "plan with a gap": (lambda out: rewrite(out, lambda m: m["plan"].__setitem__(1, [1, 4, 6])), "'plan'"),
    "entry off the plan": (lambda out: rewrite(out, lambda m: m["shards"]["1"].__setitem__("start", 2)),
                           r"'shards'\['1'\]\['start'\] is 2, the plan says 3"),
    "unplanned entry": (lambda out: rewrite(out, lambda m: m["shards"].__setitem__("7", m["shards"]["0"])),
                        "no shard 7 in the plan"),
    "sizes as text": (lambda out: rewrite(out, lambda m: m["shards"]["0"]["files"]["values.json"].__setitem__(
        "bytes", "12")), "'bytes': int"),
    "a path outside": (lambda out: rewrite(out, lambda m: m["shards"]["0"]["files"].__setitem__(
        "../../victim.txt", {"bytes": 1, "sha256": "0" * 64})), "not a path inside the shard's folder"),
    "no fingerprint": (lambda out: rewrite(out, lambda m: m.pop("fingerprint")), "'fingerprint' must be"),
    "version 1": (lambda out: rewrite(out, lambda m: m.__setitem__("version", 1)), "version 1 manifest"),
    "a folder": (lambda out: ((out / "manifest.json").unlink(), (out / "manifest.json").mkdir()), "is not a file"),
    "another format": (lambda out: rewrite(out, lambda m: m.__setitem__("format", "other-tool")),
                       "not a glassbox job manifest"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_or_hand_edited_manifest_is_refused_and_nothing_is_deleted(tmp_path, case):
    out = finished(tmp_path)
    damage, message = DAMAGE[case]
    damage(out)
    (out / ".tmp").mkdir()
    (out / ".tmp" / "shard_00002.0123456789ab").mkdir()  # debris glassbox would remove from a sound folder
    before = snapshot(out)
    with pytest.raises(ValueError, match=message) as error:
        run_job(Squares(), out, model=object(), progress=False, resume=True)
    assert "manifest.json" in str(error.value)
    assert snapshot(out) == before
    with pytest.raises(ValueError, match=message):  # and without resume: the same refusal, not "already holds"
        run_job(Squares(), out, model=object(), progress=False)
    assert snapshot(out) == before


def test_a_manifest_of_another_job_kind_is_refused_naming_both(tmp_path):
    out = finished(tmp_path)
    before = snapshot(out)

    class Cubes(Squares):
        name = "cubes"

    for resume in (True, False):
        with pytest.raises(ValueError, match="holds a 'squares' job, not a 'cubes' one"):
            run_job(Cubes(), out, model=object(), progress=False, resume=resume)
        assert snapshot(out) == before


def test_a_users_files_beside_glassboxs_are_kept_byte_for_byte(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(Squares(fail_at=2), out, model=object(), progress=False)
    mine = {"notes.txt": b"mine", "shards/readme.md": b"about the shards", ".tmp/keep.me": b"do not delete",
            "shards/shard_00009/x.bin": b"a name glassbox's plan does not have", "data-mine.arrow": b"not arrow"}
    for name, data in mine.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    (out / ".tmp" / "shard_00002.00000000abcd").mkdir()  # glassbox's debris: removed
    (out / "shards" / "shard_00003").mkdir()  # a planned shard with no entry (renamed, never recorded): removed
    (out / "shards" / "shard_00003" / "values.json").write_text("[81, 100]")
    (out / ".glassbox-tmp-0123456789ab-manifest.json").write_text("{")  # a manifest write killed before its rename
    resumed = Squares()
    assert run_job(resumed, out, model=object(), progress=False, resume=True) == SQUARES
    assert resumed.calls == [2, 3]
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, name
    assert sorted(p.name for p in (out / ".tmp").iterdir()) == ["keep.me"]
    assert not (out / ".glassbox-tmp-0123456789ab-manifest.json").exists()
    assert verify(out) == {}


def test_a_users_file_inside_a_committed_shard_refuses_the_resume_untouched(tmp_path):
    out = finished(tmp_path)
    (out / "shards" / "shard_00001" / "mine.txt").write_text("mine")
    values = out / "shards" / "shard_00002" / "values.json"
    values.write_text("[0]")  # a corrupted shard, which a sound resume would delete and recompute
    before = snapshot(out)
    with pytest.raises(ValueError, match=r"shard_00001 holds mine\.txt, which glassbox did not write"):
        run_job(Squares(), out, model=object(), progress=False, resume=True)
    assert snapshot(out) == before


def test_a_job_failing_before_a_commit_leaves_a_users_empty_folder_as_it_was(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(Squares(fail_at=0), out, model=object(), progress=False)
    assert out.is_dir() and not any(out.iterdir())


def test_a_job_killed_before_its_first_commit_is_resumable(tmp_path):
    """The manifest is written when the folder is opened, so a folder with only debris is glassbox's."""
    out = tmp_path / "out"
    manifest = Manifest.open(out, Squares())
    manifest.tmp_dir(manifest.plan[0])  # as a SIGKILL mid-shard leaves it
    assert load_manifest(out)["shards"] == {}
    resumed = Squares()
    assert run_job(resumed, out, model=object(), progress=False, resume=True) == SQUARES
    assert resumed.calls == [0, 1, 2, 3] and not (out / ".tmp").exists()


def test_an_exports_consolidation_keeps_a_users_arrow_files(tmp_path):
    pytest.importorskip("datasets")
    import numpy as np
    import torch

    from glassbox import Config, HookedTransformer
    from glassbox.scale import ArrayWindows, ExportJob

    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=8, n_layers=1, n_heads=2, d_vocab=13, n_ctx=7, d_mlp=12))
    job = ExportJob({"factory": "glassbox.unused:model"}, ArrayWindows(np.arange(24).reshape(4, 6) % 13),
                    ["blocks.0.hook_resid_post"], batch_size=2, shard_size=2)
    out = tmp_path / "out"
    run_job(job, out, model=model, progress=False)
    mine = {"data-mine.arrow": b"my own arrow file", "data-00000-of-00001.arrow.bak": b"a copy of mine"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    run_job(job, out, model=model, progress=False, resume=True)  # consolidates again
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, name
    assert sorted(p.name for p in out.glob("data-0*-of-*.arrow")) == ["data-00000-of-00002.arrow",
                                                                      "data-00001-of-00002.arrow"]


def eval_job_and_model():
    import torch

    from glassbox import Config, HookedTransformer
    from glassbox.scale import EvalJob, prompt_pairs

    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=8, n_layers=1, n_heads=2, d_vocab=13, n_ctx=7, d_mlp=12))
    pairs = prompt_pairs([{"clean": [1, 2, 3, 4], "answer": 5}, {"clean": [2, 3, 4, 5], "answer": 6}])
    return EvalJob({"factory": "glassbox.unused:model"}, pairs, batch_size=1, shard_size=1), model


def test_results_are_written_through_the_folder_writer_with_its_record(tmp_path):
    job, model = eval_job_and_model()
    out = tmp_path / "out"
    result = run_job(job, out, model=model, progress=False)
    assert json.loads((out / ".glassbox-files.json").read_text()) == {"owner": "scale-eval", "files": ["eval.json"]}
    assert json.loads((out / "eval.json").read_text()) == result
    assert sorted(p.name for p in out.iterdir()) == [".glassbox-files.json", "eval.json", "manifest.json", "shards"]


def test_a_finalize_that_fails_between_its_renames_is_finished_by_the_next_resume(tmp_path, monkeypatch):
    import glassbox.fs.folder as folder

    job, model = eval_job_and_model()
    out = tmp_path / "out"
    first = run_job(job, out, model=model, progress=False)
    (out / "notes.txt").write_text("mine")
    real = os.replace

    def fail_on_the_result(src, dst, *args, **kwargs):
        if str(dst).endswith("eval.json") and ".glassbox-tmp-" in str(src):
            raise OSError(5, "I/O error (injected)", str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(folder.os, "replace", fail_on_the_result)
    with pytest.raises(OSError, match="injected"):
        run_job(job, out, model=model, progress=False, resume=True)
    assert (out / ".glassbox-journal.json").exists()  # past the commit point: the next open finishes it
    monkeypatch.setattr(folder.os, "replace", real)
    assert run_job(job, out, model=model, progress=False, resume=True) == first
    assert json.loads((out / "eval.json").read_text()) == first
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p.name for p in out.iterdir() if p.name.startswith((".glassbox-tmp-", ".glassbox-journal"))]


def test_a_fault_at_any_file_system_call_leaves_a_folder_the_next_run_completes(tmp_path):
    """Every file-system call of a whole run (opening the folder, each shard's commit, the results) fails
    in turn; afterwards the folder is absent, empty, or resumable, and the next run gives the result of
    an uninterrupted one with a user's file (put in after the fault) kept byte for byte."""
    from fs_faults import fail_at

    job, model = eval_job_and_model()
    oracle = run_job(job, tmp_path / "oracle", model=model, progress=False)
    event = 0
    while True:
        event += 1
        out = tmp_path / f"run{event}"
        faulted, error = fail_at(event, lambda: run_job(job, out, model=model, progress=False))
        if not faulted:
            assert error is None and event > 20, (event, error)
            break
        assert error is None or isinstance(error, OSError), (event, error)  # None: a best-effort call failed
        resumable = (out / "manifest.json").exists()
        if not resumable:
            assert not out.exists() or not any(out.iterdir()), (event, sorted(p.name for p in out.rglob("*")))
        else:
            (out / "notes.txt").write_text("mine")
        assert run_job(job, out, model=model, progress=False, resume=resumable) == oracle, event
        assert json.loads((out / "eval.json").read_text()) == oracle, event
        assert not resumable or (out / "notes.txt").read_text() == "mine", event
        assert not [p for p in out.rglob(".glassbox-tmp-*")] and not (out / ".tmp").exists(), event



@pytest.mark.parametrize("resume", [False, True])
def test_a_folder_holding_only_a_killed_first_manifest_write_starts_afresh(tmp_path, resume):
    """A process killed inside the first manifest write leaves only glassbox.fs's temporary sibling."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".glassbox-tmp-0123456789ab-manifest.json").write_text('{"format": "glassbox-sc')
    assert run_job(Squares(), out, model=object(), progress=False, resume=resume) == SQUARES
    assert not [p.name for p in out.iterdir() if p.name.startswith(".glassbox-tmp-")]
    assert verify(out) == {}
