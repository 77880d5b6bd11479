"""The sweep job: an activation-patching sweep over a dataset of prompt pairs, sharded by pairs.

Each batch of pairs (``jobs_data``: one token length per batch, ``batch_size`` pairs at most) runs
``glassbox.interp.patching.activation_patch`` of ``activation`` over ``axes`` with ``reduce=None``:
the corrupted prompts, with one slice at a time set to its value in the clean run of the clean
prompts, read by the metric at the last position (``LogitDiff`` of answer and distractor by default).
A shard writes its pairs' values; ``finalize`` returns (and writes to ``out_dir/result.safetensors``
and ``result.json``) the per-pair tensor ``[*grid pair]`` in input order and its mean over every pair,
with the metric of the clean and of the corrupted run per pair beside them.

Exactness: with one batch holding every pair, the mean equals ``activation_patch(..., reduce="mean")``
on all of them bit for bit; with several batches each pair's values equal that batch's own sweep bit
for bit, and the mean is over the same per-pair tensor, so 1, 2 or 3 shards (or Ray workers) give
identical results. A different ``batch_size`` (or ``memory_budget``, which sets how many variants a
pass stacks) changes the values by float rounding only.

Footguns: position axes need one token length for every pair (refused otherwise, naming a pair);
position labels are the first pair's (job order) corrupted tokens, as activation_patch labels them, or
position numbers when the model has no tokenizer. Hooks left on the model are honoured as
``activation_patch`` honours them.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..interp.cache import run_with_cache
from ..interp.patching.engine import (ACTIVATIONS, PATCH_AXES, activation_patch, check_activation, check_stackable,
                                      resolve_template)
from ..interp.patching.metrics import LogitDiff, TargetLoss, TargetProb
from ..interp.patching.result import PatchResult
from .jobs_data import PairJob, PromptPairs

METRICS = ("logit_diff", "target_prob", "target_loss")
POSITION_AXES = ("pos", "query_pos", "key_pos")


def pair_metric(pairs: PromptPairs, metric: str, start: int, stop: int):
    """The patching metric of pairs ``start:stop`` (job order), read at the last position."""
    if metric == "logit_diff":
        return LogitDiff(pairs.rows("answer", start, stop), pairs.rows("distractor", start, stop))
    if metric == "target_prob":
        return TargetProb(pairs.rows("answer", start, stop))
    if metric == "target_loss":
        return TargetLoss(pairs.rows("answer", start, stop))
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


def check_metric(pairs: PromptPairs, metric: str, what: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    pairs.require("corrupted", "answer", *(("distractor",) if metric == "logit_diff" else ()), what=what)


def check_axes(pairs: PromptPairs, axes: Sequence[str], what: str) -> tuple:
    axes = tuple(axes)
    if not axes or not all(isinstance(a, str) for a in axes):
        raise ValueError(f"axes must be a non-empty sequence of axis names, got {axes!r}")
    if any(a in POSITION_AXES for a in axes):
        pairs.check_one_length(what)
    return axes


@dataclass
class NodeResult:
    """A sweep's (or AtP's) result over a dataset: ``mean`` [*grid], ``per_prompt`` [*grid batch] (input
    order), and the metric of each pair's clean and corrupted run ([batch])."""

    mean: PatchResult
    per_prompt: PatchResult
    clean: torch.Tensor
    corrupted: torch.Tensor

    @property
    def n_prompts(self) -> int:
        return int(self.clean.shape[0])


class NodeJob(PairJob):
    """A sweep or AtP over pairs: per-pair values [pair *grid], their mean at finalize."""

    # the activation names the job takes (checked when the job is made, before any shard runs)
    activation_names, full_hook_names = ACTIVATIONS, False

    def __init__(self, model_spec: dict, pairs: PromptPairs, activation: Union[str, Sequence[str]],
                 axes: Sequence[str], metric: str = "logit_diff", batch_size: int = 8,
                 shard_size: Optional[int] = None):
        what = f"the {self.name} job"
        check_metric(pairs, metric, what)
        self.axes = check_axes(pairs, axes, what)
        if isinstance(activation, str):
            self.activation = activation
        else:
            self.activation = list(activation)
            if not self.activation or not all(isinstance(a, str) for a in self.activation):
                raise ValueError(f"activation must be a name or a non-empty list of names, got {activation!r}")
        for name in [self.activation] if isinstance(self.activation, str) else self.activation:
            check_activation(name, self.activation_names, self.full_hook_names)
        self.metric = metric
        super().__init__(model_spec, pairs, batch_size, shard_size)
        self._labels: Optional[dict] = None

    def job_params(self) -> dict:
        return {"activation": self.activation, "axes": list(self.axes), "metric": self.metric}

    def check(self, model) -> None:
        """The activation(s) and axes on this model, and every pair's token ids (before anything runs)."""
        activations = [self.activation] if isinstance(self.activation, str) else self.activation
        check_stackable(model, activations, self.axes)
        super().check(model)

    def node_values(self, model, clean: torch.Tensor, corrupted: torch.Tensor, metric) -> PatchResult:
        raise NotImplementedError

    def compute(self, model, start: int, stop: int) -> Dict[str, torch.Tensor]:
        device = next(model.parameters()).device
        clean = self.pairs.rows("clean", start, stop, device)
        corrupted = self.pairs.rows("corrupted", start, stop, device)
        metric = pair_metric(self.pairs, self.metric, start, stop)
        result = self.node_values(model, clean, corrupted, metric)
        if self._labels is None:
            self._labels = {"axes": list(result.axes[:-1]), "labels": {a: result.labels[a] for a in result.labels},
                            "name": result.name, "metric": result.metric}
        with torch.no_grad():
            base_clean, base_corrupted = metric(model(clean)), metric(model(corrupted))
        return {"patched": result.values.movedim(-1, 0), "clean": base_clean, "corrupted": base_corrupted}

    def run_shard(self, model, spec, tmp_dir: Path) -> dict:
        self._labels = None
        entry = super().run_shard(model, spec, tmp_dir)
        entry["result"] = self._labels
        return entry

    def finalize(self, out_dir: Path, entries: List[dict]) -> NodeResult:
        from .manifest import outputs

        values = self.gather(out_dir, entries)
        patched = values["patched"]  # [pair *grid]
        n, grid = patched.shape[0], tuple(patched.shape[1:])
        per_prompt = patched.reshape(n, -1).T.contiguous()  # [variant pair], as the engine holds it
        mean = per_prompt.mean(1).reshape(grid)
        per_prompt = per_prompt.reshape(*grid, n)
        info = entries[0]["result"]
        axes, labels = tuple(info["axes"]), dict(info["labels"])
        result = NodeResult(PatchResult(mean, axes, labels, info["name"], info["metric"]),
                            PatchResult(per_prompt, axes + ("batch",), labels, info["name"], info["metric"]),
                            values["clean"], values["corrupted"])
        summary = {"job": self.name, **self.job_params(), "axes": list(axes), "labels": labels,
                   "n_prompts": n, "metric_clean_mean": float(result.clean.double().mean()),
                   "metric_corrupted_mean": float(result.corrupted.double().mean())}
        with outputs(out_dir, self.name) as writer:
            writer.save_safetensors("result.safetensors", {"mean": mean, "per_prompt": per_prompt,
                                                           "clean": result.clean, "corrupted": result.corrupted})
            writer.write_text("result.json", json.dumps(summary, indent=1))
        return result


class SweepJob(NodeJob):
    """``activation_patch`` of ``activation`` over ``axes`` (``("layer", "pos")``, ``("layer", "head")``...)
    on every pair; see the module docstring."""

    name = "sweep"

    def __init__(self, model_spec: dict, pairs: PromptPairs, activation: Union[str, Sequence[str]],
                 axes: Sequence[str], metric: str = "logit_diff", batch_size: int = 8,
                 shard_size: Optional[int] = None, memory_budget: int = 2**30):
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
            raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
        self.memory_budget = memory_budget
        super().__init__(model_spec, pairs, activation, axes, metric, batch_size, shard_size)

    def job_params(self) -> dict:
        return {**super().job_params(), "memory_budget": self.memory_budget}

    def node_values(self, model, clean, corrupted, metric) -> PatchResult:
        activations = [self.activation] if isinstance(self.activation, str) else self.activation
        names = [resolve_template(model, a).format(L=layer) for a in activations for layer in range(model.cfg.n_layers)]
        with torch.no_grad():
            _, cache = run_with_cache(model, clean, names_filter=names, return_type=None, check_memory=False)
            return activation_patch(model, corrupted, cache, metric, self.activation, self.axes, reduce=None,
                                    memory_budget=self.memory_budget)


def sweep(model: str, pairs_path, out_dir, activation, axes: Sequence[str] = ("layer", "pos"), *,
          metric: str = "logit_diff", batch_size: int = 8, shard_size: Optional[int] = None,
          memory_budget: int = 2**30, device=None, dtype: str = "float32", prepend_bos: bool = True,
          backend: str = "local", ray_address: Optional[str] = None, n_workers: Optional[int] = None,
          resume: bool = False, progress: bool = True, retries: int = 3) -> NodeResult:
    """Sweep the model ``model`` (a name or folder) over the pairs in ``pairs_path`` into ``out_dir``."""
    from .job import run_job

    spec, pairs = model_and_pairs(model, pairs_path, device, dtype, prepend_bos)
    job = SweepJob(spec, pairs, activation, axes, metric, batch_size, shard_size, memory_budget)
    return run_job(job, out_dir, backend=backend, ray_address=ray_address, n_workers=n_workers, resume=resume,
                   progress=progress, retries=retries)


def model_and_pairs(model: str, pairs_path, device, dtype, prepend_bos: bool, required=("clean",)) -> tuple:
    """(model spec, PromptPairs tokenized with the model's saved tokenizer or GPT-2's) for the helpers."""
    from .jobs_data import load_pairs

    spec = {"name_or_path": str(Path(model).resolve()) if Path(model).is_dir() else str(model),
            "device": None if device is None else str(device), "dtype": str(dtype)}
    return spec, load_pairs(pairs_path, saved_tokenizer(model), prepend_bos=prepend_bos, required=required)


def saved_tokenizer(model: str):
    """The tokenizer saved with the model, or None (then only pairs given as token ids can be read); a
    model that cannot be found is an error naming it."""
    from ..weights.pretrained import TOKENIZER_FILES, load_tokenizer, resolve

    folder = resolve(model)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    return load_tokenizer(folder)


__all__ = ["METRICS", "NodeJob", "NodeResult", "PATCH_AXES", "SweepJob", "pair_metric", "sweep"]
