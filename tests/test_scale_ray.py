"""The Ray backend (glassbox.scale.ray_backend): same bits as in-process, faults lose nothing.

One Ray cluster for the whole module, started by ``ray.init`` in a subprocess (as a user's cluster
would be, with token authentication); every test JOINS it by address through ``run_job(...,
ray_address=...)``. One test starts its own local cluster (``address=None``), the CLI's ``--ray``.

Oracles: a plain loop over the same batches calling the glassbox model directly (no glassbox.scale
code), the in-process backend's files (sha256), and the job's own call log (which shards ran, where).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch

# The module's cluster uses token authentication (Ray's default for a new cluster), and a driver joining
# one by address must opt in: Ray reads the mode once, so it is set before Ray is imported.
os.environ.setdefault("RAY_AUTH_MODE", "token")
ray = pytest.importorskip("ray")

from conftest import TINY, make_hf_gpt2  # noqa: E402
from glassbox.scale import even_plan, load_manifest, run_job, verify  # noqa: E402
from glassbox.scale.manifest import Manifest  # noqa: E402
from glassbox.weights import from_pretrained  # noqa: E402

# The job classes below are defined here, not in an importable package: send them to workers by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOOKS = ("blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern", "blocks.1.hook_resid_post")
N_WINDOWS, CTX, SHARD, BATCH = 23, 11, 4, 3  # 6 shards (the last of 3 windows), 2 batches per shard
HEAD = """
import sys, ray
ray.init(num_cpus=3, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@dataclass
class ActsJob:
    """Caches HOOKS over token windows; one .npy per hook per shard. Test switches: ``hold`` (the first
    attempt of that shard writes part of its files, announces its pid and waits for a release flag),
    ``die`` (that shard's worker SIGKILLs itself every time), ``fail`` (that shard's run_shard raises)."""

    tokens: np.ndarray
    model_dir: str
    log_dir: str
    hold: Optional[int] = None
    die: Optional[int] = None
    fail: Optional[int] = None
    device: str = "cpu"
    name: str = field(default="acts", init=False)

    def plan(self):
        return even_plan(len(self.tokens), SHARD)

    def model_spec(self):
        return {"name_or_path": self.model_dir, "device": self.device, "dtype": "float32"}

    def params(self):
        return {"hooks": list(HOOKS), "windows": self.tokens.tolist(), "batch": BATCH}

    def shard_tokens(self, spec):
        return spec.n_items * CTX

    def run_shard(self, model, spec, tmp_dir):
        log = Path(self.log_dir)
        with open(log / "calls.log", "a") as f:
            f.write(f"{spec.index} {os.getpid()}\n")
        if spec.index == self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if spec.index == self.fail:
            raise ValueError(f"bad window in shard {spec.index}")
        arrays = batched_acts(model, self.tokens[spec.start:spec.stop])
        if spec.index == self.hold and not (log / "release").exists():
            np.save(tmp_dir / f"{HOOKS[0]}.npy", arrays[HOOKS[0]])  # a half-written shard
            (log / "inside.tmp").write_text(str(os.getpid()))
            os.replace(log / "inside.tmp", log / "inside")
            deadline = time.monotonic() + 120
            while not (log / "release").exists():
                if time.monotonic() > deadline:
                    raise TimeoutError("never killed nor released")
                time.sleep(0.02)
        for hook, array in arrays.items():
            np.save(tmp_dir / f"{hook}.npy", array)
        return {"rows": spec.n_items, "tokens": spec.n_items * CTX}

    def finalize(self, out_dir, entries):
        return {hook: np.concatenate([np.load(Path(out_dir) / "shards" / f"shard_{e['index']:05d}" / f"{hook}.npy")
                                      for e in entries]) for hook in HOOKS}


def batched_acts(model, windows) -> dict:
    """The hooks' activations over ``windows`` in batches of BATCH, straight from the model."""
    out = {hook: [] for hook in HOOKS}
    with torch.no_grad():
        for b in range(0, len(windows), BATCH):
            _, cache = model.run_with_cache(torch.tensor(windows[b:b + BATCH]), names_filter=list(HOOKS))
            for hook in HOOKS:
                out[hook].append(cache[hook].numpy())
    return {hook: np.concatenate(parts) for hook, parts in out.items()}


def calls(job) -> list:
    path = Path(job.log_dir) / "calls.log"
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    make_hf_gpt2(seed=5, **TINY).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, TINY["vocab_size"], size=(N_WINDOWS, CTX), dtype=np.int64)


@contextlib.contextmanager
def threads(n):
    """torch's intra-op thread count: CPU kernels at small batch sizes round differently at 1 and 2 threads
    (measured: a batch of one window, up to 1.5e-7 apart), so bit-equality needs the workers' count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def by_hand(model_dir, tokens, n_threads=1):
    """Per-shard batches computed by hand (same batch composition), concatenated."""
    model = from_pretrained(model_dir, device="cpu", dtype="float32").eval()
    with threads(n_threads):
        parts = [batched_acts(model, tokens[s.start:s.stop]) for s in even_plan(N_WINDOWS, SHARD)]
    return {hook: np.concatenate([p[hook] for p in parts]) for hook in HOOKS}


@pytest.fixture(scope="module")
def oracle(model_dir, tokens):
    return by_hand(model_dir, tokens)  # at the workers' one thread each (cpus_per_worker=1)


@pytest.fixture(scope="module")
def cluster():
    """A 3-CPU Ray cluster in its own process; its address. Token authentication, as Ray starts them."""
    assert os.environ["RAY_AUTH_MODE"] == "token"
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = head.stdout.readline().strip()
        assert address.count(":") == 1, f"the head did not start: {address!r}"
        yield address
    finally:
        head.stdin.close()
        head.wait(timeout=60)


def new_job(tmp_path, model_dir, tokens, **switches) -> ActsJob:
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return ActsJob(tokens=tokens, model_dir=model_dir, log_dir=str(log), **switches)


def assert_complete(out_dir, n_shards=6):
    """Every planned shard committed once, verified, nothing left half-written."""
    assert verify(out_dir) == {}
    assert sorted(p.name for p in (Path(out_dir) / "shards").iterdir()) == [f"shard_{i:05d}" for i in range(n_shards)]
    assert sorted(load_manifest(out_dir)["shards"]) == sorted(str(i) for i in range(n_shards))
    tmp = Path(out_dir) / ".tmp"
    assert not tmp.exists() or not any(tmp.iterdir())


def test_export_on_a_local_cluster_equals_in_process(tmp_path, model_dir, tokens):
    """address=None (the CLI's --ray) starts a new local cluster of n_workers CPUs and stops it; the
    export (SAELens's layout) over 2 workers holds the in-process export's bytes, shard by shard."""
    import datasets

    from glassbox.scale.corpus import ArrayWindows
    from glassbox.scale.export import ExportJob

    hooks = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"]
    job = ExportJob({"name_or_path": model_dir, "device": "cpu", "dtype": "float32"}, ArrayWindows(tokens), hooks,
                    batch_size=2, shard_size=4)
    with threads(1):
        run_job(job, tmp_path / "local", progress=False)
    assert not ray.is_initialized()
    run_job(job, tmp_path / "ray", backend="ray", n_workers=2, progress=False)
    assert not ray.is_initialized()
    local, remote = load_manifest(tmp_path / "local")["shards"], load_manifest(tmp_path / "ray")["shards"]
    assert {k: e["files"] for k, e in remote.items()} == {k: e["files"] for k, e in local.items()}
    assert len({e["worker"] for e in remote.values()}) == 2
    a, b = datasets.load_from_disk(str(tmp_path / "local")), datasets.load_from_disk(str(tmp_path / "ray"))
    assert a.column_names == b.column_names == hooks + ["token_ids"] and len(b) == N_WINDOWS
    for column in a.column_names:
        assert np.array_equal(np.asarray(a[column]), np.asarray(b[column])), column
    assert_complete(tmp_path / "ray")


@pytest.mark.parametrize("n_workers, cpus", [(1, 2), (3, 1)])  # 2 workers: every other test
def test_ray_equals_in_process(tmp_path, model_dir, tokens, cluster, n_workers, cpus):
    """Joined by address: the same bits as a hand loop and the in-process run at the workers' thread count."""
    from glassbox.scale.ray_backend import run_ray

    expected = by_hand(model_dir, tokens, n_threads=cpus)
    (tmp_path / "a").mkdir()
    with threads(cpus):
        local = run_job(new_job(tmp_path / "a", model_dir, tokens), tmp_path / "local", progress=False)
    job = new_job(tmp_path, model_dir, tokens)
    entries = run_ray(job, tmp_path / "ray", address=cluster, n_workers=n_workers, cpus_per_worker=cpus,
                      progress=False)
    assert not ray.is_initialized()  # joined, then only disconnected
    result = job.finalize(tmp_path / "ray", entries)
    for hook in HOOKS:
        assert result[hook].shape == expected[hook].shape
        assert np.array_equal(result[hook], expected[hook]), hook
        assert np.array_equal(local[hook], expected[hook]), hook
    ray_entries = load_manifest(tmp_path / "ray")["shards"]
    local_entries = load_manifest(tmp_path / "local")["shards"]
    assert {k: e["files"] for k, e in ray_entries.items()} == {k: e["files"] for k, e in local_entries.items()}
    assert entries == [ray_entries[str(i)] for i in range(6)]
    workers = {e["worker"] for e in ray_entries.values()}
    assert len(workers) <= n_workers and all(w.startswith("ray:") for w in workers)
    assert sorted(i for i, _ in calls(job)) == list(range(6))  # each shard computed once
    assert os.getpid() not in {pid for _, pid in calls(job)}
    assert_complete(tmp_path / "ray")


def test_sweep_on_ray_equals_in_process(tmp_path, model_dir, cluster):
    """A patching sweep over prompt pairs (4 shards of one batch) on 2 workers: the in-process
    per-pair values and metrics bit for bit."""
    from glassbox.scale.jobs_data import PromptPairs
    from glassbox.scale.jobs_sweep import SweepJob

    rng = np.random.default_rng(3)
    clean = [rng.integers(0, TINY["vocab_size"], size=6).tolist() for _ in range(7)]
    corrupted = [[(t + 1) % TINY["vocab_size"] if i == 1 else t for i, t in enumerate(row)] for row in clean]
    pairs = PromptPairs(clean, corrupted, rng.integers(0, 29, 7).tolist(), rng.integers(0, 29, 7).tolist())
    job = SweepJob({"name_or_path": model_dir, "device": "cpu", "dtype": "float32"}, pairs, "resid_pre",
                   ("layer", "pos"), batch_size=2, shard_size=2)
    with threads(1):
        local = run_job(job, tmp_path / "local", progress=False)
    remote = run_job(job, tmp_path / "ray", backend="ray", ray_address=cluster, n_workers=2, progress=False)
    assert remote.per_prompt.axes == local.per_prompt.axes and remote.per_prompt.labels == local.per_prompt.labels
    assert torch.equal(remote.per_prompt.values, local.per_prompt.values)
    assert torch.equal(remote.mean.values, local.mean.values)
    assert torch.equal(remote.clean, local.clean) and torch.equal(remote.corrupted, local.corrupted)
    assert len(load_manifest(tmp_path / "ray")["plan"]) == 4
    assert verify(tmp_path / "ray") == {}


def test_killed_worker_is_retried(tmp_path, model_dir, tokens, oracle, cluster, capsys):
    """SIGKILL a worker while it is inside shard 2, half its files written: the shard runs again on a
    fresh actor, nothing is lost, duplicated or half-written, and the output is the uninterrupted one."""
    job = new_job(tmp_path, model_dir, tokens, hold=2)
    log = Path(job.log_dir)
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while not (log / "inside").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = int((log / "inside").read_text())
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)
        (log / "release").write_text("")

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=2, progress=True)
    thread.join(timeout=10)
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    final = [line for line in bar if line.startswith("acts: 100%")][-1]  # tokens of all workers' shards
    assert f" {N_WINDOWS * CTX}/{N_WINDOWS * CTX} " in final and "tok/s" in final, final
    assert "shards 6/6 workers " in final and final.rstrip().endswith(" retries 1]"), final  # the replacement may
    # still be starting when the other worker has taken the last shards: "workers" counts those up
    assert len(killed) == 1 and killed[0] != os.getpid()
    ran = calls(job)
    assert sorted(i for i, _ in ran) == [0, 1, 2, 2, 3, 4, 5]  # only shard 2 ran twice
    assert [pid for i, pid in ran if i == 2][0] == killed[0]
    for hook in HOOKS:
        assert np.array_equal(result[hook], oracle[hook]), hook
    entries = load_manifest(tmp_path / "out")["shards"]
    assert entries["2"]["attempts"] == 2 and f"pid{killed[0]}" not in entries["2"]["worker"]
    assert all(e["attempts"] == 1 for k, e in entries.items() if k != "2")
    assert_complete(tmp_path / "out")


class Interrupt(Exception):
    pass


def test_interrupted_job_resumes(tmp_path, model_dir, tokens, oracle, cluster, monkeypatch):
    """The driver raises at its third commit; resume=True runs only the shards not committed, once each."""
    job = new_job(tmp_path, model_dir, tokens)
    commit = Manifest.commit
    count = [0]

    def failing_commit(self, spec, *args, **kwargs):
        count[0] += 1
        if count[0] == 3:
            raise Interrupt("driver interrupted")
        return commit(self, spec, *args, **kwargs)

    monkeypatch.setattr(Manifest, "commit", failing_commit)
    with pytest.raises(Interrupt):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=2, progress=False)
    monkeypatch.setattr(Manifest, "commit", commit)
    assert not ray.is_initialized()
    first = load_manifest(tmp_path / "out")["shards"]
    assert len(first) == 2
    with pytest.raises(FileExistsError, match="resume"):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, progress=False)
    n_first = len(calls(job))
    result = run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=1, resume=True,
                     progress=False)
    resumed = sorted(i for i, _ in calls(job)[n_first:])
    assert resumed == sorted(set(range(6)) - {int(k) for k in first})  # verified shards skipped
    final = load_manifest(tmp_path / "out")["shards"]
    assert all(final[k] == first[k] for k in first)  # kept as committed, not recomputed
    for hook in HOOKS:
        assert np.array_equal(result[hook], oracle[hook]), hook
    assert_complete(tmp_path / "out")


def test_worker_dying_every_time_names_the_shard(tmp_path, model_dir, tokens, cluster):
    job = new_job(tmp_path, model_dir, tokens, die=1)
    with pytest.raises(RuntimeError, match=r"shard 1 \(shard_00001, items 4:8\) failed: its Ray worker died 2 "):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=1, retries=1,
                progress=False)
    assert [i for i, _ in calls(job)].count(1) == 2
    assert "1" not in load_manifest(tmp_path / "out")["shards"]
    assert not (tmp_path / "out" / "shards" / "shard_00001").exists()


def test_run_shard_error_is_not_retried(tmp_path, model_dir, tokens, cluster):
    job = new_job(tmp_path, model_dir, tokens, fail=0)
    # a bad input raised in a worker comes back as its own type and message, prefixed with where it ran
    with pytest.raises(ValueError, match=r"^shard 0 \(shard_00000, items 0:4\) on Ray worker ray:.*: bad window in "
                                         r"shard 0$"):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=1, progress=False)
    assert calls(job)[0][0] == 0 and [i for i, _ in calls(job)].count(0) == 1


def test_the_callers_connection_is_used_and_left_open(tmp_path, model_dir, tokens, oracle, cluster):
    """Connected already (ray.init by the caller): run_ray uses that cluster, leaves the connection open,
    and refuses an address naming another cluster."""
    ray.init(address=cluster)
    try:
        host, port = cluster.rsplit(":", 1)
        with pytest.raises(ValueError, match="already connected to the Ray cluster at .* cannot also join"):
            run_job(new_job(tmp_path, model_dir, tokens), tmp_path / "other", backend="ray",
                    ray_address=f"{host}:{int(port) + 1}", progress=False)
        result = run_job(new_job(tmp_path, model_dir, tokens), tmp_path / "out", backend="ray", n_workers=1,
                         progress=False)
        assert ray.is_initialized() and ray.get_runtime_context().gcs_address == cluster
        assert not (tmp_path / "other").exists()  # refused before anything was made
    finally:
        ray.shutdown()
    for hook in HOOKS:
        assert np.array_equal(result[hook], oracle[hook]), hook


def test_cuda_spec_on_a_cluster_without_gpus_is_refused(tmp_path, model_dir, tokens, cluster):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    job = new_job(tmp_path, model_dir, tokens, device="cuda:1")
    with pytest.raises(ValueError, match=r"needs 1 GPU\(s\) but the Ray cluster has 0"):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, progress=False)
    assert not ray.is_initialized()


def test_a_model_that_cannot_be_built_is_reported_at_once(tmp_path, model_dir, tokens, cluster):
    job = new_job(tmp_path, str(tmp_path / "no_model"), tokens)
    with pytest.raises(ValueError, match=r"no_model'? is neither a folder"):  # found by the driver: no cluster
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=2, progress=False)
    assert not ray.is_initialized() and not (tmp_path / "out").exists()
    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # header intact, the last tensor's bytes cut short
    job = new_job(tmp_path, str(damaged), tokens)
    with pytest.raises(ValueError, match=r"^a Ray worker could not start \(building the model from .*damaged.*\): .*"
                                         r"model\.safetensors"):
        run_job(job, tmp_path / "out", backend="ray", ray_address=cluster, n_workers=2, progress=False)
    assert calls(job) == [] and not (tmp_path / "out").exists()  # nothing ran, no folder left


def test_bad_arguments(tmp_path, model_dir, tokens):
    job = new_job(tmp_path, model_dir, tokens)
    from glassbox.scale.ray_backend import run_ray

    for kwargs, message in [({"n_workers": 0}, "n_workers must be an int >= 1"),
                            ({"retries": -1}, "retries must be an int >= 0"),
                            ({"cpus_per_worker": 0}, "cpus_per_worker must be an int >= 1"),
                            ({"address": ""}, "address must be a Ray cluster address")]:
        with pytest.raises(ValueError, match=message):
            run_ray(job, tmp_path / "out", progress=False, **kwargs)
    assert not ray.is_initialized()


def test_gpus_per_replica_and_the_spec_inside_the_actor():
    """A replica's GPUs (what its actor asks Ray for) and its spec renumbered to the actor's visible
    devices cuda:0..k-1 (Ray sets CUDA_VISIBLE_DEVICES); a CPU spec is left as is."""
    from glassbox.scale.ray_worker import gpus_per_replica, worker_model_spec

    cases = [
        ({"name_or_path": "m", "device": "cpu"}, 0, {"name_or_path": "m", "device": "cpu"}),
        ({"name_or_path": "m"}, 0, {"name_or_path": "m"}),
        ({"name_or_path": "m", "device": "cuda:3"}, 1, {"name_or_path": "m", "device": "cuda"}),
        ({"name_or_path": "m", "device_map": ["cuda:2", "cuda:5"]}, 2,
         {"name_or_path": "m", "device_map": ["cuda:0", "cuda:1"]}),
        ({"name_or_path": "m", "device_map": {"embed": 4, "blocks.0": "cuda:4", "blocks.1": "cuda:6",
                                              "ln_final": "cuda:6", "unembed": "cpu"}}, 2,
         {"name_or_path": "m", "device_map": {"embed": "cuda:0", "blocks.0": "cuda:0", "blocks.1": "cuda:1",
                                              "ln_final": "cuda:1", "unembed": "cpu"}}),
        ({"name_or_path": "m", "device_map": ["cpu", "cpu"]}, 0, {"name_or_path": "m", "device_map": ["cpu", "cpu"]}),
        ({"name_or_path": "m", "device": "cuda:1", "n_devices": 3}, 3,
         {"name_or_path": "m", "device": "cuda", "n_devices": 3}),
    ]
    for spec, gpus, inside in cases:
        assert gpus_per_replica(spec) == gpus, spec
        assert worker_model_spec(spec, gpus) == inside, spec
    with pytest.raises(ValueError, match="device_map='auto' cannot be sized for Ray actors"):
        gpus_per_replica({"name_or_path": "m", "device_map": "auto"})
