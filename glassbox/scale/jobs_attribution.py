"""The attribution jobs over a dataset of prompt pairs: node attribution (AtP, AtP*) and edge attribution (EAP).

- ``AttributionJob``: ``glassbox.interp.attribution.attribution_patch`` (``method="atp"`` or ``"atp*"``)
  of ``activation`` over ``axes`` on every batch of pairs with ``reduce=None``: the per-pair estimates
  are written per shard, and ``finalize`` returns the same ``NodeResult`` as the sweep job (per-pair
  [*grid batch] in input order, their mean, the clean and corrupted metric per pair), so an AtP and
  its exact sweep over a dataset compare directly.
- ``EdgeAttributionJob``: ``glassbox.interp.attribution.eap`` (EAP, EAP-IG-inputs, EAP-IG-activations)
  on every batch; eap gives one ``Graph`` per batch whose scores are that batch's mean over its pairs.
  A shard writes each batch's float32 scores and pair count; ``finalize`` combines them into ONE
  ``Graph``: the pair-weighted mean ``sum_b n_b scores_b / N``, summed in float64 over the batches in
  batch order (so it does not depend on the shards), rounded to float32 once. Its metadata's
  ``metric_clean`` / ``metric_corrupted`` are pair-weighted likewise and ``n_prompts`` is N. Written
  to ``out_dir/graph.json`` (``Graph.save_json``).

Exactness as for the sweep (``jobs_sweep``): results are bit-identical across shard and worker counts,
and equal the in-process calls on the same batches bit for bit; with one batch of every pair, the
AtP mean equals ``attribution_patch(..., reduce="mean")`` and the Graph equals ``eap`` on all pairs up
to the float32 -> float64 -> float32 round trip of the mean (exact: n_b / N = 1). A different
``batch_size`` changes values by float rounding only.

Footguns: gradients are needed (never call these under ``torch.inference_mode``); a position axis needs
one token length for every pair; eap needs one token length per batch, which the length grouping gives.
"""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..interp.attribution import METHODS as EAP_METHODS
from ..interp.attribution import ATP_ACTIVATIONS, Graph, attribution_patch, eap
from ..interp.patching.result import PatchResult
from .jobs_data import PairJob, PromptPairs
from .jobs_sweep import NodeJob, check_metric, model_and_pairs, pair_metric

ATP_METHODS = ("atp", "atp*")


class AttributionJob(NodeJob):
    """AtP (or AtP*) estimates of ``activation_patch`` of ``activation`` over ``axes`` on every pair."""

    name = "attribution"
    activation_names, full_hook_names = ATP_ACTIVATIONS, True

    def __init__(self, model_spec: dict, pairs: PromptPairs, activation: Union[str, Sequence[str]],
                 axes: Sequence[str], metric: str = "logit_diff", batch_size: int = 8,
                 shard_size: Optional[int] = None, method: str = "atp"):
        if method not in ATP_METHODS:
            raise ValueError(f"method must be one of {ATP_METHODS} (edge attribution is EdgeAttributionJob), "
                             f"got {method!r}")
        self.method = method
        super().__init__(model_spec, pairs, activation, axes, metric, batch_size, shard_size)

    def job_params(self) -> dict:
        return {**super().job_params(), "method": self.method}

    def node_values(self, model, clean, corrupted, metric) -> PatchResult:
        return attribution_patch(model, clean, corrupted, metric, self.activation, self.axes, reduce=None,
                                 method=self.method)


class EdgeAttributionJob(PairJob):
    """Edge scores (EAP or EAP-IG) over every pair, combined into one ``Graph`` (module docstring)."""

    name = "attribution"

    def __init__(self, model_spec: dict, pairs: PromptPairs, metric: str = "logit_diff", method: str = "EAP",
                 steps: Optional[int] = None, batch_size: int = 8, shard_size: Optional[int] = None):
        check_metric(pairs, metric, "the edge attribution job")
        if method not in EAP_METHODS:
            raise ValueError(f"method must be one of {EAP_METHODS}, got {method!r}")
        if method == "EAP" and steps not in (None, 1):
            raise ValueError(f"EAP takes one gradient (steps=None or 1), got steps={steps!r}")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        self.metric, self.method, self.steps = metric, method, steps
        super().__init__(model_spec, pairs, batch_size, shard_size)
        self._meta: Optional[dict] = None

    def job_params(self) -> dict:
        return {"metric": self.metric, "method": self.method, "steps": self.steps}

    def compute(self, model, start: int, stop: int) -> Dict[str, torch.Tensor]:
        device = next(model.parameters()).device
        clean = self.pairs.rows("clean", start, stop, device)
        corrupted = self.pairs.rows("corrupted", start, stop, device)
        graph = eap(model, clean, corrupted, pair_metric(self.pairs, self.metric, start, stop), method=self.method,
                    steps=self.steps)
        if self._meta is None:
            self._meta = {"senders": graph.senders, "receivers": graph.receivers,
                          "metadata": {k: v for k, v in graph.metadata.items()
                                       if k not in ("metric_clean", "metric_corrupted", "n_prompts", "n_positions",
                                                    "metric_repr")}}
        n = stop - start
        return {"batch_scores": graph.scores[None], "batch_n": torch.tensor([n], dtype=torch.long),
                "batch_metric_clean": torch.tensor([graph.metadata["metric_clean"]], dtype=torch.float64),
                "batch_metric_corrupted": torch.tensor([graph.metadata["metric_corrupted"]], dtype=torch.float64)}

    def run_shard(self, model, spec, tmp_dir: Path) -> dict:
        self._meta = None
        entry = super().run_shard(model, spec, tmp_dir)
        entry["graph"] = self._meta
        return entry

    def finalize(self, out_dir: Path, entries: List[dict]) -> Graph:
        values = self.gather(out_dir, entries)
        graph = combine_graphs(values["batch_scores"], values["batch_n"], values["batch_metric_clean"],
                               values["batch_metric_corrupted"], entries[0]["graph"])
        from .manifest import outputs

        with outputs(out_dir, self.name) as writer:  # the text Graph.save_json writes
            writer.write_text("graph.json", json.dumps(graph.to_json(), allow_nan=False))
        return graph


def combine_graphs(scores: torch.Tensor, counts: torch.Tensor, metric_clean: torch.Tensor,
                   metric_corrupted: torch.Tensor, info: dict) -> Graph:
    """One Graph from per-batch mean scores [batch S R] and pair counts [batch]: the pair-weighted mean,
    accumulated in float64 in batch order (NaN where no edge exists stays NaN)."""
    total = int(counts.sum())
    acc = torch.zeros(scores.shape[1:], dtype=torch.float64)
    clean = corrupted = 0.0
    for b in range(scores.shape[0]):
        n = int(counts[b])
        acc += scores[b].double() * n
        clean += float(metric_clean[b]) * n
        corrupted += float(metric_corrupted[b]) * n
    metadata = {**info["metadata"], "metric_clean": clean / total, "metric_corrupted": corrupted / total,
                "n_prompts": total, "n_batches": int(scores.shape[0]),
                "score": "pair-weighted mean over batches of eap's per-batch scores (mean over prompts)"}
    return Graph(info["senders"], info["receivers"], (acc / total).float(), metadata)


def attribute(model: str, pairs_path, out_dir, activation=None, axes: Sequence[str] = ("layer", "pos"), *,
              method: str = "atp", metric: str = "logit_diff", steps: Optional[int] = None, batch_size: int = 8,
              shard_size: Optional[int] = None, device=None, dtype: str = "float32", prepend_bos: bool = True,
              backend: str = "local", ray_address: Optional[str] = None, n_workers: Optional[int] = None,
              resume: bool = False, progress: bool = True, retries: int = 3):
    """AtP / AtP* of ``activation`` over ``axes`` (a ``NodeResult``), or with an EAP ``method`` the edge
    Graph, of the model ``model`` over the pairs in ``pairs_path``, into ``out_dir``."""
    from .job import run_job

    spec, pairs = model_and_pairs(model, pairs_path, device, dtype, prepend_bos)
    if method in ATP_METHODS:
        if activation is None:
            raise ValueError(f"method {method!r} attributes nodes: give the activation (e.g. 'z', 'resid_pre')")
        job = AttributionJob(spec, pairs, activation, axes, metric, batch_size, shard_size, method)
    elif method in EAP_METHODS:
        if activation is not None:
            raise ValueError(f"method {method!r} scores every edge of the graph; it takes no activation")
        job = EdgeAttributionJob(spec, pairs, metric, method, steps, batch_size, shard_size)
    else:
        raise ValueError(f"method must be one of {ATP_METHODS + tuple(EAP_METHODS)}, got {method!r}")
    return run_job(job, out_dir, backend=backend, ray_address=ray_address, n_workers=n_workers, resume=resume,
                   progress=progress, retries=retries)


def graph_summary(graph: Graph, k: int = 10) -> str:
    """The top ``k`` edges by |score|, one a line."""
    return "\n".join(f"{s} -> {r}: {v:+.5g}" for s, r, v in graph.edges()[:k])


__all__ = ["ATP_METHODS", "AttributionJob", "EdgeAttributionJob", "attribute", "combine_graphs", "graph_summary"]
