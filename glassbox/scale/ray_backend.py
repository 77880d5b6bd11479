"""The Ray backend of ``run_job``: one model replica per Ray actor, shards handed out from a queue.

``run_ray(job, out_dir, ...)`` opens the manifest (``resume`` keeps the verified shards), joins or starts
a cluster (``ray_cluster``), starts ``n_workers`` actors (``ray_worker.ShardWorker``, each building the
model once from ``job.model_spec()``) and hands pending shards out one at a time, in plan order, to
whichever actor is free. It returns every shard's manifest entry in plan order.

Who commits: the DRIVER. For each attempt it makes a fresh ``out_dir/.tmp/shard_XXXXX.<uuid>/``; the
actor's ``run_shard`` fills it, and only when that task has returned does the driver hash, sync, rename
and record it (``Manifest.commit``). A worker never writes ``manifest.json`` or ``shards/``, so a shard
whose files are not complete is never recorded. Footgun: ``out_dir`` must be on a filesystem every
worker sees at the same path (one machine, or a shared mount on a cluster); each actor checks this
when it starts.

Faults: actors run with ``max_restarts=0`` and ``max_task_retries=0``, so Ray never re-runs a task by
itself (it would re-run into the dead attempt's half-written folder). When an actor dies mid-shard
(``RayActorError``/``ActorDiedError``: process killed, out of memory, node lost), the driver deletes
that attempt's folder, puts the shard back at the head of the queue, and starts a replacement actor; a
shard is tried at most ``1 + retries`` times, then a RuntimeError names it. An exception raised by
``run_shard`` itself (``RayTaskError``: a bug or bad input, which a retry would repeat) is not retried:
a RuntimeError names the shard and carries the worker's traceback. An actor that fails to build its
model is reported at once. On any error (or Ctrl-C) the actors are killed; in-flight folders stay as
``.tmp/`` debris, removed when the job is opened again, and ``resume=True`` continues from the
committed shards.

Resources: each actor asks Ray for ``cpus_per_worker`` CPUs (and sets torch's thread count to it) and,
when the model spec is on CUDA, the GPUs of one replica (``ray_worker.gpus_per_replica``): one for
``device="cuda:N"`` (``num_gpus=1``), k for a device map over k GPUs or ``n_devices=k``; inside the
actor its GPUs are cuda:0..k-1 and the spec is renumbered to match (``worker_model_spec``).
``n_workers=None`` means as many actors as the cluster can hold (CPUs // cpus_per_worker, or GPUs //
GPUs per replica), never more than the pending shards. Actors the cluster cannot
place yet simply wait; a job with no actor started after ``start_timeout_s`` is refused.

Results do not depend on the split: the plan fixes each shard's batch composition and every shard is
computed by one replica alone, so outputs equal the in-process run bit for bit on the same device type,
dtype and kernels (CPU matmuls measured identical at 1 and 2 threads; other libraries may differ).

Progress: the driver's tqdm bar counts the tokens (``job.shard_tokens``) or items of committed shards,
so its rate and ETA are aggregate tokens/s across workers; the postfix shows shards done, workers up and
retries.
"""

import collections
import time
import uuid
from pathlib import Path
from typing import List, Optional

from ..fs.atomic import write_text
from ..fs.staged import discard_tree
from .job import shard_weight
from .local import progress_bar
from .manifest import TMP, Manifest
from .ray_cluster import check_address, import_ray, ray_cluster
from .ray_worker import ShardWorker, gpus_per_replica, worker_model_spec

_POLL_S = 1.0  # how often the driver wakes to check start-up timeouts while nothing finishes


def _check_count(name: str, value, minimum: int, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{' or None' if allow_none else ''}, got {value!r}")


def _died_errors(ray) -> tuple:
    """The errors meaning "the actor (its process or node) is gone", as opposed to run_shard raising."""
    ex = ray.exceptions
    return tuple(getattr(ex, name) for name in ("RayActorError", "WorkerCrashedError", "NodeDiedError",
                                                "OutOfMemoryError", "LocalRayletDiedError") if hasattr(ex, name))


# Errors a worker raises about the job's inputs: they reach the caller as the same type and one line,
# as they would in-process (so the CLI prints them as one line too).
USER_ERRORS = (ValueError, KeyError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError)


def worker_error(error, where: str) -> Exception:
    """The exception to raise for a worker's ``RayTaskError``: its cause's type with ``where`` and the
    cause's own message when it is one of ``USER_ERRORS``; else a RuntimeError carrying Ray's text
    (with the worker's traceback)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, USER_ERRORS):
        message = cause.args[0] if isinstance(cause, KeyError) and cause.args else str(cause)
        try:
            again = type(cause)(f"{where}: {message}")
        except Exception:  # noqa: BLE001 - a type that takes other arguments
            again = None
        if again is not None and again.args and str(again.args[0]).startswith(where):
            return again
    return RuntimeError(f"{where} raised: {error}")


def _shard_text(spec) -> str:
    return f"shard {spec.index} ({spec.name}, items {spec.start}:{spec.stop})"


def run_ray(job, out_dir, *, address: Optional[str] = None, n_workers: Optional[int] = None, resume: bool = False,
            progress: bool = True, retries: int = 3, cpus_per_worker: int = 1,
            start_timeout_s: float = 600.0) -> List[dict]:
    """Run ``job``'s pending shards on Ray actors and return all its entries in plan order (with nothing
    pending, e.g. a resume of a finished job, Ray is not started).

    Args:
        address: a Ray cluster to join (``"host:port"`` or ``"auto"``); None starts a local cluster
            (or uses this process's existing connection). See ``glassbox.scale.ray_cluster``.
        n_workers: actors (model replicas); None: as many as the cluster holds, at most the pending shards.
        resume: keep an earlier run's verified shards (``Manifest.open``).
        retries: how often one shard may be tried again after its actor died (0: never).
        cpus_per_worker: CPUs Ray reserves per actor, and the actor's torch thread count.
        start_timeout_s: how long to wait for a first actor to start before giving up.
    """
    _check_count("n_workers", n_workers, 1)
    _check_count("retries", retries, 0, allow_none=False)
    _check_count("cpus_per_worker", cpus_per_worker, 1, allow_none=False)
    check_address(address)
    out_dir = Path(out_dir).absolute()  # workers resolve paths from their own working folders
    manifest = Manifest.open(out_dir, job, resume=resume)
    pending = manifest.pending()
    if not pending:
        return manifest.entries()
    try:
        _run(job, manifest, pending, address, n_workers, retries, cpus_per_worker, start_timeout_s, progress)
    except BaseException:
        manifest.discard_if_empty()  # failed before any commit: leave no folder behind
        raise
    return manifest.entries()


def _run(job, manifest, pending, address, n_workers, retries, cpus_per_worker, start_timeout_s, progress) -> None:
    ray = import_ray()
    model_spec = dict(job.model_spec())
    gpus = gpus_per_replica(model_spec)
    num_cpus = n_workers * cpus_per_worker if n_workers is not None else None
    probe = manifest.out_dir / TMP / f"ray_probe.{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().hex
    write_text(probe, token)
    try:
        with ray_cluster(address, num_cpus=num_cpus):
            # Every Ray handle (actors, the job's object ref) lives in this call's frame only, so it is
            # released before the connection closes.
            _on_cluster(ray, job, manifest, pending, model_spec, gpus, n_workers, retries, cpus_per_worker,
                        start_timeout_s, progress, str(probe), token)
    finally:
        discard_tree(probe)


def _on_cluster(ray, job, manifest, pending, model_spec, gpus, n_workers, retries, cpus_per_worker,
                start_timeout_s, progress, probe, token) -> None:
    resources = ray.cluster_resources()
    if gpus and resources.get("GPU", 0) < gpus:
        raise ValueError(f"one replica of the model spec ({model_spec}) needs {gpus} GPU(s) but the Ray "
                         f"cluster has {resources.get('GPU', 0):g} (resources {resources})")
    if n_workers is None:
        n_workers = int(resources.get("GPU", 0)) // gpus if gpus else int(resources.get("CPU", 0)) // cpus_per_worker
    n_workers = max(1, min(n_workers, len(pending)))
    needs = {"CPU": cpus_per_worker, **({"GPU": gpus} if gpus else {})}
    actor_class = ray.remote(ShardWorker).options(num_cpus=cpus_per_worker, num_gpus=gpus, max_restarts=0,
                                                  max_task_retries=0)
    args = (ray.put(job), worker_model_spec(model_spec, gpus), probe, token, cpus_per_worker, manifest.fingerprint)
    pool = _Pool(ray, actor_class, args, needs)
    bar = progress_bar(job, manifest, progress)
    try:
        _drive(ray, job, manifest, pool, collections.deque(pending), n_workers, retries, start_timeout_s, bar)
    finally:
        if bar is not None:
            bar.close()
        pool.kill_all()
        pool.args = None


class _Pool:
    """The driver's view of its actors: starting (a readiness probe in flight), idle, or busy on a shard."""

    def __init__(self, ray, actor_class, args, needs):
        self.ray, self.actor_class, self.args, self.needs = ray, actor_class, args, needs
        self.starting = {}  # probe ref -> (actor, time started)
        self.idle = []  # (actor, info)
        self.busy = {}  # task ref -> (actor, info, spec, tmp folder)

    def start(self) -> None:
        actor = self.actor_class.remote(*self.args)
        self.starting[actor.info.remote()] = (actor, time.monotonic())

    def up(self) -> int:
        return len(self.idle) + len(self.busy)

    def kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass

    def kill_all(self) -> None:
        for actor, _ in self.starting.values():
            self.kill(actor)
        for actor, _ in self.idle:
            self.kill(actor)
        for actor, _, _, _ in self.busy.values():
            self.kill(actor)
        self.starting, self.idle, self.busy = {}, [], {}


def _worker_name(info: dict) -> str:
    return f"ray:{(info.get('actor_id') or '')[:12]}:pid{info.get('pid')}"


def _drive(ray, job, manifest, pool, queue, n_workers, retries, start_timeout_s, bar) -> None:
    died = _died_errors(ray)
    attempts = collections.Counter()  # shard index -> failed attempts
    lost_at_start = 0
    n_retried = 0
    for _ in range(n_workers):
        pool.start()
    began = time.monotonic()

    def show():
        if bar is not None:
            total = len(manifest.plan)
            bar.set_postfix_str(f"shards {total - len(manifest.pending())}/{total} workers {pool.up()}"
                                + (f" retries {n_retried}" if n_retried else ""))

    show()
    while queue or pool.busy:
        while pool.idle and queue:
            actor, info = pool.idle.pop()
            spec = queue.popleft()
            tmp = manifest.tmp_dir(spec)
            pool.busy[actor.run.remote(spec.to_json(), str(tmp))] = (actor, info, spec, tmp)
        if not pool.busy and not pool.starting:
            raise RuntimeError(f"no Ray worker is left to run {len(queue)} pending shard(s)")
        ready, _ = ray.wait(list(pool.busy) + list(pool.starting), num_returns=1, timeout=_POLL_S)
        if not ready:
            if not pool.up() and time.monotonic() - began > start_timeout_s:
                raise TimeoutError(f"no Ray worker started within {start_timeout_s:.0f} s: can the cluster "
                                   f"({ray.cluster_resources()}) place an actor needing {pool.needs}?")
            continue
        ref = ready[0]
        if ref in pool.starting:
            actor, _ = pool.starting.pop(ref)
            try:
                info = ray.get(ref)
            except ray.exceptions.RayTaskError as error:  # the worker could not start: its own error
                raise worker_error(error, "a Ray worker could not start (building the model from "
                                          f"{pool.args[1]})") from error
            except died as error:
                if getattr(error, "actor_init_failed", False):
                    raise RuntimeError(f"a Ray worker could not start (building the model from "
                                       f"{pool.args[1]} or checking out_dir failed): {error}") from error
                lost_at_start += 1
                if lost_at_start > max(1, retries) * n_workers:
                    raise RuntimeError(f"{lost_at_start} Ray workers died while starting; last: {error}") from error
                pool.start()
                continue
            pool.idle.append((actor, info))
            show()
            continue
        actor, info, spec, tmp = pool.busy.pop(ref)
        try:
            result = ray.get(ref)
        except died as error:
            pool.kill(actor)
            discard_tree(tmp)  # the dead attempt's partial files; never committed
            attempts[spec.index] += 1
            if attempts[spec.index] > retries:
                raise RuntimeError(f"{_shard_text(spec)} failed: its Ray worker died {attempts[spec.index]} "
                                   f"time(s) (retries={retries}); last on {_worker_name(info)} at "
                                   f"{info.get('host')}: {error}") from error
            n_retried += 1
            queue.appendleft(spec)
            pool.start()
            show()
            continue
        except ray.exceptions.RayTaskError as error:
            discard_tree(tmp)  # a shard that raised leaves nothing
            raise worker_error(error, f"{_shard_text(spec)} on Ray worker {_worker_name(info)} at "
                                      f"{info.get('host')}") from error
        entry = dict(result["entry"])
        entry["attempts"] = attempts[spec.index] + 1
        manifest.commit(spec, tmp, entry, wall_s=result["wall_s"], worker=_worker_name(info), host=info["host"])
        pool.idle.append((actor, info))
        if bar is not None:
            bar.update(shard_weight(job, spec))
        show()
