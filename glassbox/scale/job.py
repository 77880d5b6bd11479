"""The job model: a job is a deterministic plan of shards, each computed by one model replica.

A job (export, sweep, attribution, eval) implements the ``Job`` protocol:

- ``plan()`` cuts the job's input (token windows, prompt pairs...) into ``ShardSpec`` item ranges. The
  plan depends only on the job's parameters, never on the worker count, and it fixes the batch
  composition inside each shard; that is why 1, 2 or 3 workers give bit-identical results.
- ``model_spec()`` says how a worker builds the model (``build_model``): a plain, JSON-serialisable dict.
- ``run_shard(model, spec, tmp_dir)`` computes one shard, writes its files under ``tmp_dir`` (a fresh,
  empty folder) and returns its manifest entry (rows, token range...). It must not write elsewhere.
- ``finalize(out_dir, entries)`` combines the committed shards (entries in shard order).

Optional members read by the runners: ``check(model)`` (refuse what the job cannot compute on this
model, run by ``run_job`` on the given model or on the spec's meta-device skeleton before any folder
is opened or any Ray cluster started), ``params()`` (a JSON dict of the job's parameters, recorded in the
manifest and checked on resume), ``shard_tokens(spec)`` and ``unit`` (what a progress bar counts; items
of the plan by default).

``run_job`` runs a job in-process (``backend="local"``, the default: no Ray import) or on Ray
(``backend="ray"``, ``glassbox.scale.ray_backend.run_ray``, imported only then). Shards are committed
atomically through ``glassbox.scale.manifest``; ``resume=True`` skips shards that verify.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Protocol, Union, runtime_checkable

BACKENDS = ("local", "ray")
SCALE_EXTRA = "pip install -e '.[scale]'"  # how to get ray and datasets


@dataclass(frozen=True)
class ShardSpec:
    """One unit of work, fully determined by the job's plan: items ``start:stop`` of the job's input."""

    index: int
    start: int
    stop: int

    def __post_init__(self):
        for name in ("index", "start", "stop"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ShardSpec.{name} must be an int >= 0, got {value!r}")
        if self.stop <= self.start:
            raise ValueError(f"ShardSpec {self.index}: stop={self.stop} must be > start={self.start}")

    @property
    def n_items(self) -> int:
        return self.stop - self.start

    @property
    def name(self) -> str:
        """The shard's folder name: ``shard_00007``."""
        return f"shard_{self.index:05d}"

    def to_json(self) -> list:
        return [self.index, self.start, self.stop]

    @classmethod
    def from_json(cls, value) -> "ShardSpec":
        return cls(*value)


@runtime_checkable
class Job(Protocol):
    """What a runner needs from a job (see the module docstring)."""

    name: str

    def plan(self) -> List[ShardSpec]: ...

    def model_spec(self) -> dict: ...

    def run_shard(self, model, spec: ShardSpec, tmp_dir: Path) -> dict: ...

    def finalize(self, out_dir: Path, entries: List[dict]) -> Any: ...


def even_plan(n_items: int, shard_size: int) -> List[ShardSpec]:
    """Shards of ``shard_size`` items (the last one shorter), in order."""
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 1:
        raise ValueError(f"n_items must be an int >= 1, got {n_items!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be an int >= 1, got {shard_size!r}")
    return [ShardSpec(i, start, min(start + shard_size, n_items))
            for i, start in enumerate(range(0, n_items, shard_size))]


def check_plan(plan: List[ShardSpec]) -> List[ShardSpec]:
    """The plan, checked: indices 0..n-1 in order, item ranges contiguous from 0, none empty."""
    plan = list(plan)
    if not plan:
        raise ValueError("the job's plan has no shards")
    at = 0
    for i, spec in enumerate(plan):
        if not isinstance(spec, ShardSpec):
            raise TypeError(f"plan[{i}] is a {type(spec).__name__}, not a ShardSpec")
        if spec.index != i or spec.start != at:
            raise ValueError(f"plan[{i}] = {spec}: expected index {i} starting at item {at}")
        at = spec.stop
    return plan


def job_params(job) -> dict:
    """The job's parameters as recorded in the manifest (``job.params()`` if it has one)."""
    params = getattr(job, "params", None)
    return dict(params()) if callable(params) else {}


def shard_weight(job, spec: ShardSpec) -> int:
    """What a progress bar counts for one shard: ``job.shard_tokens(spec)`` or its item count."""
    tokens = getattr(job, "shard_tokens", None)
    return int(tokens(spec)) if callable(tokens) else spec.n_items


def progress_unit(job) -> str:
    return "tok" if callable(getattr(job, "shard_tokens", None)) else str(getattr(job, "unit", "item"))


def build_model(model_spec: dict):
    """A model built from a job's ``model_spec`` (what every worker calls once).

    ``{"name_or_path": ..., "device": ..., "dtype": ...}`` loads with ``glassbox.from_pretrained`` (any
    further keys are its weight-processing options). ``{"factory": "package.module:function", "kwargs":
    {...}, "device": ..., "dtype": ...}`` calls an importable function instead (it must return the model
    on that device and dtype). The model is put in eval mode.
    """
    spec = dict(model_spec)
    device, dtype = spec.pop("device", None), spec.pop("dtype", "float32")
    if "factory" in spec:
        import importlib

        target = spec.pop("factory")
        module, _, attr = str(target).partition(":")
        if not module or not attr:
            raise ValueError(f"model_spec factory must be 'package.module:function', got {target!r}")
        model = getattr(importlib.import_module(module), attr)(device=device, dtype=dtype, **spec.pop("kwargs", {}))
    elif "name_or_path" in spec:
        from ..weights.pretrained import from_pretrained

        model = from_pretrained(spec.pop("name_or_path"), device=device, dtype=dtype, **spec)
    else:
        raise ValueError(f"model_spec needs 'name_or_path' or 'factory', got keys {sorted(model_spec)}")
    return model.eval()


def skeleton_model(model_spec: dict):
    """The model a ``name_or_path`` spec builds, on the meta device (its config, hooks and shapes, no weights
    read), for checking a job before any worker starts; None for a factory spec (not built until a worker
    runs)."""
    if "name_or_path" not in model_spec:
        return None
    from ..models import HookedTransformer
    from ..weights.pretrained import config_of

    return HookedTransformer(config_of(model_spec["name_or_path"]), device="meta")


def check_job(job, model=None) -> None:
    """Run ``job.check(model)`` (when the job has one) on ``model``, or on the skeleton of its spec: a bad
    hook, activation, axis or token id is refused here, before a folder is opened or a cluster started."""
    check = getattr(job, "check", None)
    if not callable(check):
        return
    model = skeleton_model(dict(job.model_spec())) if model is None else model
    if model is not None:
        check(model)


def run_job(job, out_dir: Union[str, Path], *, backend: str = "local", ray_address: Optional[str] = None,
            n_workers: Optional[int] = None, resume: bool = False, progress: bool = True, model=None,
            retries: int = 3, cpus_per_worker: int = 1) -> Any:
    """Run ``job`` into ``out_dir`` and return ``job.finalize(out_dir, entries)``.

    Args:
        backend: "local" (in-process, one model, no Ray import) or "ray" (one replica per worker; a
            local cluster, or the one at ``ray_address``).
        n_workers: Ray workers (default: Ray's choice); refused for "local".
        resume: keep the shards of an earlier run of the same job that verify; without it, a folder
            that already holds a job is refused.
        model: local only, an already built model used instead of ``build_model(job.model_spec())``
            (it must be the model the spec describes: the manifest records the spec).
        retries: ray only, how often a shard whose worker died is tried again.
        cpus_per_worker: ray only, the CPUs each replica reserves (its torch thread count).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    out_dir = Path(out_dir)
    if backend == "local" and (ray_address is not None or n_workers is not None):
        raise ValueError("ray_address and n_workers need backend='ray'")
    if backend == "ray" and model is not None:
        raise ValueError("model= is for backend='local'; Ray workers build theirs from job.model_spec()")
    check_job(job, model)
    if backend == "local":
        from .local import run_local

        entries = run_local(job, out_dir, resume=resume, progress=progress, model=model)
    else:
        try:
            from .ray_backend import run_ray
        except ModuleNotFoundError as error:
            if error.name is not None and error.name.split(".")[0] == "ray":
                raise ImportError(f"backend='ray' needs ray: {SCALE_EXTRA}") from error
            raise
        entries = run_ray(job, out_dir, address=ray_address, n_workers=n_workers, resume=resume,
                          progress=progress, retries=retries, cpus_per_worker=cpus_per_worker)
    result = job.finalize(out_dir, entries)
    from .manifest import tidy

    tidy(out_dir)
    return result
