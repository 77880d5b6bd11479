"""The job model: plans, atomic shard commits, verification and resume (a raising and a SIGKILLed job).

Jobs here need no model: each shard writes the squares of its items, so every expected value is a hand
computation and every checksum is recomputed with hashlib.
"""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glassbox.scale import Manifest, ShardSpec, even_plan, load_manifest, run_job, verify

REPO = Path(__file__).resolve().parents[1]

JOB_SOURCE = '''
import json, os, time
from pathlib import Path
from glassbox.scale import even_plan

class Squares:
    """Shard [start, stop) -> values.json (the squares) and a second file, so shards have several files."""
    name = "squares"

    def __init__(self, n=11, k=3, fail_at=None, hang_at=None, marker=None):
        self.n, self.k, self.fail_at, self.hang_at, self.marker = n, k, fail_at, hang_at, marker
        self.calls = []

    def plan(self):
        return even_plan(self.n, self.k)

    def params(self):
        return {"n": self.n, "k": self.k}

    def model_spec(self):
        return {"factory": "none:none"}

    def run_shard(self, model, spec, tmp):
        self.calls.append(spec.index)
        (tmp / "values.json").write_text(json.dumps([i * i for i in range(spec.start, spec.stop)]))
        if spec.index == self.fail_at:
            raise RuntimeError("shard failed on purpose")
        if spec.index == self.hang_at:
            Path(self.marker).write_text("in shard")
            time.sleep(600)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "count.txt").write_text(str(spec.n_items))
        return {"rows": spec.n_items}

    def finalize(self, out_dir, entries):
        values = []
        for e in entries:
            values += json.loads((Path(out_dir) / "shards" / f"shard_{e['index']:05d}" / "values.json").read_text())
        return values
'''
namespace = {}
exec(compile(JOB_SOURCE, "squares_job", "exec"), namespace)
Squares = namespace["Squares"]
SQUARES = [i * i for i in range(11)]


def files_of(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def shard_files(out: Path) -> dict:
    return files_of(out / "shards")


def test_shard_spec_and_plans():
    assert even_plan(11, 3) == [ShardSpec(0, 0, 3), ShardSpec(1, 3, 6), ShardSpec(2, 6, 9), ShardSpec(3, 9, 11)]
    assert even_plan(6, 6) == [ShardSpec(0, 0, 6)]
    assert ShardSpec(7, 2, 5).name == "shard_00007" and ShardSpec(7, 2, 5).n_items == 3
    with pytest.raises(ValueError, match="stop=2 must be > start=2"):
        ShardSpec(0, 2, 2)
    with pytest.raises(ValueError, match="ShardSpec.index"):
        ShardSpec(-1, 0, 2)
    with pytest.raises(ValueError, match="shard_size"):
        even_plan(5, 0)


def test_run_local_commits_every_shard_with_its_checksums(tmp_path):
    out = tmp_path / "out"
    assert run_job(Squares(), out, model=object(), progress=False) == SQUARES
    manifest = load_manifest(out)
    assert manifest["job"] == "squares" and manifest["params"] == {"n": 11, "k": 3}
    assert manifest["plan"] == [[0, 0, 3], [1, 3, 6], [2, 6, 9], [3, 9, 11]]
    assert sorted(manifest["shards"]) == ["0", "1", "2", "3"]
    for key, entry in manifest["shards"].items():
        folder = out / "shards" / f"shard_{int(key):05d}"
        assert set(entry["files"]) == {"values.json", "sub/count.txt"}
        for name, info in entry["files"].items():
            data = (folder / name).read_bytes()
            assert info == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        assert entry["rows"] == entry["stop"] - entry["start"]
        assert entry["worker"] == "local" and entry["wall_s"] >= 0
    assert verify(out) == {}
    assert not (out / ".tmp").exists()


def test_a_folder_holding_a_job_is_refused_without_resume(tmp_path):
    out = tmp_path / "out"
    run_job(Squares(), out, model=object(), progress=False)
    with pytest.raises(FileExistsError, match="resume"):
        run_job(Squares(), out, model=object(), progress=False)
    with pytest.raises(ValueError, match=r"params\.k was 3, now 4"):
        run_job(Squares(k=4), out, model=object(), progress=False, resume=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        run_job(Squares(), other, model=object(), progress=False, resume=True)
    assert (other / "notes.txt").read_text() == "mine"


def test_resume_after_a_raising_shard_redoes_only_what_is_missing(tmp_path):
    clean, out = tmp_path / "clean", tmp_path / "out"
    run_job(Squares(), clean, model=object(), progress=False)
    failing = Squares(fail_at=2)
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(failing, out, model=object(), progress=False)
    assert failing.calls == [0, 1, 2]
    assert sorted(load_manifest(out)["shards"]) == ["0", "1"]  # the failed shard is not recorded
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["shard_00000", "shard_00001"]
    assert not any((out / ".tmp").iterdir())  # the shard that raised left nothing
    resumed = Squares()
    assert run_job(resumed, out, model=object(), progress=False, resume=True) == SQUARES
    assert resumed.calls == [2, 3]
    assert not (out / ".tmp").exists()  # a successful run leaves no .tmp/
    assert shard_files(out) == shard_files(clean)


def test_resume_recomputes_a_corrupted_or_missing_shard_and_drops_strays(tmp_path):
    clean, out = tmp_path / "clean", tmp_path / "out"
    run_job(Squares(), clean, model=object(), progress=False)
    run_job(Squares(), out, model=object(), progress=False)
    values = out / "shards" / "shard_00001" / "values.json"
    values.write_bytes(values.read_bytes().replace(b"16", b"17"))  # same size, different bytes
    (out / "shards" / "shard_00003" / "sub" / "count.txt").unlink()
    (out / "shards" / "shard_00009").mkdir()  # not a planned shard: not glassbox's, so it stays
    problems = verify(out)
    assert sorted(problems) == [1, 3]
    assert "sha256" in problems[1] and "count.txt" in problems[3]
    manifest = Manifest.open(out, Squares(), resume=True)
    assert sorted(manifest.dropped) == [1, 3]
    assert [s.index for s in manifest.pending()] == [1, 3]
    assert (out / "shards" / "shard_00009").is_dir()
    resumed = Squares()
    assert run_job(resumed, out, model=object(), progress=False, resume=True) == SQUARES
    assert resumed.calls == [1, 3]
    assert shard_files(out) == shard_files(clean) and verify(out) == {}


def test_a_job_failing_before_its_first_commit_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(Squares(fail_at=0), out, model=object(), progress=False)
    assert not out.exists()
    assert run_job(Squares(), out, model=object(), progress=False) == SQUARES  # no resume needed


def test_commit_refuses_a_second_commit_and_reserved_keys(tmp_path):
    manifest = Manifest.open(tmp_path / "out", Squares(), resume=False)
    spec = manifest.plan[0]
    tmp = manifest.tmp_dir(spec)
    with pytest.raises(ValueError, match="wrote no files"):
        manifest.commit(spec, tmp, {})
    (tmp / "a").write_text("x")
    with pytest.raises(ValueError, match="sha256"):
        manifest.commit(spec, tmp, {"sha256": "mine"})
    manifest.commit(spec, tmp, {"rows": 3})
    with pytest.raises(ValueError, match="already committed"):
        manifest.commit(spec, manifest.tmp_dir(spec), {"rows": 3})
    with pytest.raises(RuntimeError, match="not committed"):
        manifest.entries()


def test_a_job_killed_mid_shard_resumes_to_the_uninterrupted_result(tmp_path):
    clean, out, marker = tmp_path / "clean", tmp_path / "out", tmp_path / "marker"
    run_job(Squares(), clean, model=object(), progress=False)
    script = JOB_SOURCE + (f"\nfrom glassbox.scale import run_job\nrun_job(Squares(hang_at=2, marker={str(marker)!r}), "
                           f"{str(out)!r}, model=object(), progress=False)\n")
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert child.poll() is None, "the job exited before reaching shard 2"
            assert time.time() < deadline, "the job never reached shard 2"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert sorted(load_manifest(out)["shards"]) == ["0", "1"]
    half = [p for p in (out / ".tmp").iterdir()]
    assert len(half) == 1 and (half[0] / "values.json").exists()  # the half-written shard is debris
    resumed = Squares()
    assert run_job(resumed, out, model=object(), progress=False, resume=True) == SQUARES
    assert resumed.calls == [2, 3]
    assert shard_files(out) == shard_files(clean)


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_local_backend_imports_neither_ray_nor_datasets(tmp_path):
    code = JOB_SOURCE + f"""
import sys
from glassbox.scale import run_job
assert run_job(Squares(), {str(tmp_path / 'out')!r}, model=object(), progress=True) == [i * i for i in range(11)]
print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'datasets', 'pyarrow')))
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert "item/s" in result.stderr  # the progress bar


def test_the_ray_backend_without_ray_names_the_extra(tmp_path):
    code = JOB_SOURCE + f"""
import sys
sys.modules["ray"] = None  # as if ray were not installed
from glassbox.scale import run_job
try:
    run_job(Squares(), {str(tmp_path / 'out')!r}, backend="ray", progress=False)
except ImportError as error:
    print(error)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "pip install -e '.[scale]'" in result.stdout


def test_bad_backend_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="backend"):
        run_job(Squares(), tmp_path / "o", backend="dask")
    with pytest.raises(ValueError, match="n_workers"):
        run_job(Squares(), tmp_path / "o", n_workers=2)
    with pytest.raises(ValueError, match="model="):
        run_job(Squares(), tmp_path / "o", backend="ray", model=object())


def make_model(device=None, dtype="float32", d_model=7):
    """A factory for model_spec: a seeded tiny model."""
    import torch

    from glassbox import Config, HookedTransformer

    torch.manual_seed(0)
    return HookedTransformer(Config(d_model=d_model, n_layers=1, n_heads=1, d_vocab=11, n_ctx=5, d_mlp=13),
                             device=device, dtype=getattr(torch, dtype))


def test_build_model_from_a_folder_or_a_factory(tmp_path):
    import torch

    from glassbox.scale import build_model
    from glassbox.weights import save_pretrained

    model = make_model()
    save_pretrained(model, tmp_path / "m")
    loaded = build_model({"name_or_path": str(tmp_path / "m"), "device": "cpu", "dtype": "float64"})
    assert not loaded.training and loaded.W_E.dtype == torch.float64
    assert torch.equal(loaded.W_E, model.W_E.double())
    made = build_model({"factory": f"{__name__}:make_model", "kwargs": {"d_model": 9}, "dtype": "float32"})
    assert made.cfg.d_model == 9 and not made.training
    with pytest.raises(ValueError, match="'name_or_path' or 'factory'"):
        build_model({"device": "cpu"})
    with pytest.raises(ValueError, match="package.module:function"):
        build_model({"factory": "make_model"})
