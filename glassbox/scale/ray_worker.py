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


def _cuda_index(device):
    """The CUDA index a device_map value names (an int is one, as Hugging Face writes it), else None."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    text = str(device)
    if text.split(":")[0] != "cuda":
        return None
    return int(text.split(":")[1]) if ":" in text else 0


def gpus_per_replica(model_spec: dict) -> int:
    """How many GPUs one replica of ``model_spec`` takes: its device map's distinct CUDA devices,
    ``n_devices``, 1 for a CUDA ``device``, else 0. ``"auto"``/``"balanced"`` maps are refused: they mean
    "every visible GPU", which is not a number a Ray actor can ask for."""
    device_map, n_devices = model_spec.get("device_map"), model_spec.get("n_devices")
    if n_devices is not None:
        return int(n_devices)
    if device_map is None:
        return 1 if _cuda_index(model_spec.get("device") or "cpu") is not None else 0
    if isinstance(device_map, str):
        raise ValueError(f"model_spec device_map={device_map!r} cannot be sized for Ray actors (each asks for a "
                         "number of GPUs): give a list of devices (['cuda:0', 'cuda:1']) or n_devices")
    values = device_map.values() if isinstance(device_map, dict) else device_map
    return len({i for i in map(_cuda_index, values) if i is not None})


def worker_model_spec(model_spec: dict, n_gpus: int) -> dict:
    """The spec a worker builds its model from, with CUDA devices renumbered from 0.

    Ray gives an actor asking for k GPUs exactly k devices through ``CUDA_VISIBLE_DEVICES``, seen inside
    it as cuda:0 .. cuda:k-1, so ``cuda:N`` becomes ``cuda``, and a device map's distinct CUDA devices
    become cuda:0, cuda:1... in index order. The manifest still records the spec as the job gave it.
    """
    spec = dict(model_spec)
    if not n_gpus:
        return spec
    device_map = spec.get("device_map")
    if device_map is not None:
        values = device_map.values() if isinstance(device_map, dict) else device_map
        order = {i: k for k, i in enumerate(sorted({i for i in map(_cuda_index, values) if i is not None}))}

        def renumber(device):
            i = _cuda_index(device)
            return device if i is None else f"cuda:{order[i]}"

        if isinstance(device_map, dict):
            spec["device_map"] = {part: renumber(d) for part, d in device_map.items()}
        else:
            spec["device_map"] = [renumber(d) for d in device_map]
    elif spec.get("device") is not None and _cuda_index(spec["device"]) is not None:
        spec["device"] = "cuda"
    elif spec.get("n_devices") is not None:
        spec["device"] = "cuda"
    return spec


class ShardWorker:
    """One model replica (built once from the job's model spec) that runs the job's shards one at a time."""

    def __init__(self, job, model_spec: dict, probe: str, token: str, threads: int, fingerprint=None):
        # An error here is kept and raised by info(), the driver's readiness probe: then it reaches the
        # driver as the task error it is (its type and message), not as an actor that died.
        self.error = None
        try:
            self._start(job, model_spec, probe, token, threads, fingerprint)
        except Exception as error:  # noqa: BLE001 - reported by info()
            self.error = error

    def _start(self, job, model_spec, probe, token, threads, fingerprint) -> None:
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
        if fingerprint is not None:  # the model files the driver hashed, unchanged since
            fingerprint.check_unchanged(f" (seen by a Ray worker on {socket.gethostname()})")

    def info(self) -> dict:
        """Who this worker is: pid, host, Ray node and actor ids (also the readiness probe)."""
        if self.error is not None:
            raise self.error
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
