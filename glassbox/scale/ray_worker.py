"""The body of one Ray worker: a model replica that computes shards into folders the driver made.

``ShardWorker`` is a plain class (this module never imports Ray); ``ray_backend`` wraps it with
``ray.remote`` at run time, so it travels to the workers by reference (``glassbox`` must be importable
there) while the job itself travels by value, once, through Ray's object store.

Contract: a worker only fills the fresh temporary folder it is handed and returns the job's entry once
``run_shard`` has returned; it never touches ``manifest.json`` or ``shards/`` (the driver commits).
"""

import os
import socket
import time
from pathlib import Path

from .job import ShardSpec, build_model


def worker_model_spec(model_spec: dict, gpu: bool) -> dict:
    """The spec a worker builds its model from: on a GPU worker ``cuda:N`` becomes ``cuda``.

    Ray gives a GPU actor exactly one device through ``CUDA_VISIBLE_DEVICES``, so inside the actor it is
    always ``cuda:0``; the manifest still records the spec as the job gave it.
    """
    spec = dict(model_spec)
    if gpu:
        spec["device"] = "cuda"
    return spec


def is_cuda_spec(model_spec: dict) -> bool:
    return str(model_spec.get("device") or "cpu").split(":")[0] == "cuda"


class ShardWorker:
    """One model replica (built once from the job's model spec) that runs the job's shards one at a time."""

    def __init__(self, job, model_spec: dict, probe: str, token: str, threads: int):
        # The driver wrote ``token`` into ``probe`` (under out_dir/.tmp/): if this worker cannot read it
        # back, out_dir is not on a filesystem shared with the driver, which could never commit its files.
        try:
            seen = Path(probe).read_text()
        except OSError:
            seen = None
        if seen != token:
            raise FileNotFoundError(f"the driver's out_dir (its probe file {probe}) is not visible on Ray worker "
                                    f"host {socket.gethostname()}: the Ray backend needs out_dir on a filesystem "
                                    "every worker sees at the same path")
        import torch

        torch.set_num_threads(int(threads))  # Ray sets OMP_NUM_THREADS too; torch may have read it already
        self.job = job
        self.model = build_model(model_spec)

    def info(self) -> dict:
        """Who this worker is: pid, host, Ray node and actor ids (also the readiness probe)."""
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": context.get_node_id(),
                "actor_id": context.get_actor_id()}

    def run(self, spec_json: list, tmp_dir: str) -> dict:
        """Compute one shard into ``tmp_dir`` (fresh and empty, made by the driver); return its entry."""
        spec = ShardSpec.from_json(spec_json)
        folder = Path(tmp_dir)
        if not folder.is_dir() or any(folder.iterdir()):
            raise RuntimeError(f"shard {spec.index}: {folder} is not the fresh, empty folder the driver made "
                               "(is out_dir on a filesystem shared with the driver?)")
        began = time.perf_counter()
        entry = self.job.run_shard(self.model, spec, folder)
        if not isinstance(entry, dict):
            raise TypeError(f"run_shard must return a dict (the shard's manifest entry), got "
                            f"{type(entry).__name__} for shard {spec.index}")
        return {"entry": dict(entry), "wall_s": time.perf_counter() - began}
