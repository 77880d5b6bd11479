"""Feature patching: the batched patching engine over an SAE's features x positions.

``feature_patch(model, corrupted, clean_cache, metric, sae, ("pos", "feature"))`` runs the corrupted
tokens once per variant (every position x feature), each time replacing one feature's activation at one
position (``hook_sae_acts_post`` of the spliced SAE) by its value in ``clean_cache``, and returns the
metric of every variant as a ``PatchResult`` [pos feature]. ``feature_ablate`` does the same on one run
of ``tokens``, setting the activation to zero or to its mean (over the run's prompts and positions, or a
given [d_sae] vector). ``axes=("feature",)`` patches (ablates) a feature at every position at once.

Contract: the SAE must be spliced into the model (``model.saes([sae], use_error_term=...)``); the
result equals the loop

    for (pos, feature) in grid:
        metric(model.run_with_hooks(corrupted, fwd_hooks=[("<hook>.hook_sae_acts_post", set(pos, feature))]))

with the model spliced as it is (error term on or off), to float rounding of the batched matrix products.
``clean_cache`` is a mapping holding ``<hook>.hook_sae_acts_post`` of the clean run with the same SAE
spliced ([prompt pos d_sae], the corrupted run's shape); ``features`` picks the feature ids swept
(default all d_sae: d_sae x pos forwards' worth of work, so pick).

It is the patching engine's machinery (``glassbox.interp.patching``): variants side by side on the batch
axis in passes sized by ``memory_budget``; every variant joins the batch at the SAE's block, from the
corrupted run's cached residual stream there; with ``reuse_prefix`` a variant patching position p
computes positions p: only (the SAE acts position by position, attention is causal); metrics,
``reduce``, user hooks (``fwd_hooks=`` and hooks on the model, honoured per variant as the engine does)
and the readout are the engine's. Hooks are removed however a sweep ends; weights are never written.
"""

import itertools
import re
from collections.abc import Mapping
from typing import Optional, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor

from ..patching.engine import (DEFAULT_BANDS, DEFAULT_MEMORY_BUDGET, Metric, Sweep, check_clean, patch_mask,
                               patch_rows, progress_bar)
from ..patching.readout import Readout
from ..patching.result import PatchResult
from ..patching.runner import run_staggered
from ..patching.user_hooks import user_hooks
from .base import SAE
from .features import acts_name

AXES = (("pos", "feature"), ("feature",))
_BLOCK = re.compile(r"blocks\.(\d+)\.")


class FeatureSweep(Sweep):
    """The engine's Sweep, its memory estimate counting the SAE's activations (and their clean recompute)."""

    def __init__(self, *args, d_sae: int):
        super().__init__(*args)
        self.d_sae = d_sae

    def row_bytes(self, span: int, materialised: bool) -> int:
        elt = torch.finfo(next(self.model.parameters()).dtype).bits // 8
        return super().row_bytes(span, materialised) + span * 6 * self.d_sae * elt


def spliced_layer(model, sae: SAE) -> int:
    """The block where the SAE first acts (a transcoder's read hook); refuses an SAE not spliced in."""
    if not isinstance(sae, SAE):
        raise TypeError(f"expected a glassbox SAE, got {type(sae).__name__}")
    if not any(s is sae for s in model.acts_to_saes.values()):
        raise ValueError(f"the SAE at {sae.cfg.hook_out} is not spliced into the model; patch its features inside "
                         "`with model.saes([sae], use_error_term=...)` (the clean cache from the same splice)")
    layers = [_BLOCK.match(name) for name in (sae.cfg.hook_name, sae.cfg.hook_out)]
    if not all(layers):
        raise ValueError(f"feature patching starts from a block's residual stream; the SAE at {sae.cfg.hook_name}"
                         f" -> {sae.cfg.hook_out} is outside the blocks")
    return min(int(m.group(1)) for m in layers)


def feature_ids(features, d_sae: int) -> list:
    if features is None:
        return list(range(d_sae))
    ids = torch.as_tensor(features).flatten().tolist()
    if not ids or any(isinstance(i, float) or not 0 <= i < d_sae for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"features must be distinct feature ids in [0, d_sae={d_sae}), got {features!r}")
    return [int(i) for i in ids]


def feature_patch(model, corrupted_tokens: Union[Int[Tensor, "batch pos"], str, list], clean_cache: Mapping,
                  metric: Metric, sae: SAE, axes: Sequence[str] = ("pos", "feature"), *,
                  features: Optional[Sequence[int]] = None, attention_mask: Optional[Tensor] = None,
                  reduce: Optional[str] = "mean", memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool = False,
                  reuse_prefix: bool = True, bands: Optional[int] = DEFAULT_BANDS,
                  fwd_hooks: Sequence = ()) -> PatchResult:
    """Patch each feature (at each position) from ``clean_cache`` into the corrupted run (module docstring)."""
    return sweep_features(model, corrupted_tokens, attention_mask, metric, sae, axes, features, "patch", clean_cache,
                          reduce, memory_budget, progress, reuse_prefix, bands, fwd_hooks)


def feature_ablate(model, tokens: Union[Int[Tensor, "batch pos"], str, list], metric: Metric, sae: SAE,
                   axes: Sequence[str] = ("pos", "feature"), *, value: Union[str, Tensor] = "zero",
                   features: Optional[Sequence[int]] = None, attention_mask: Optional[Tensor] = None,
                   reduce: Optional[str] = "mean", memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool = False,
                   reuse_prefix: bool = True, bands: Optional[int] = DEFAULT_BANDS,
                   fwd_hooks: Sequence = ()) -> PatchResult:
    """Set each feature (at each position) to ``value``: "zero", "mean" (its mean activation over this run's
    prompts and unpadded positions, under ``fwd_hooks``) or a [d_sae] tensor of values."""
    if isinstance(value, str) and value not in ("zero", "mean"):
        raise ValueError(f"value must be 'zero', 'mean' or a [d_sae] tensor, got {value!r}")
    if isinstance(value, Tensor) and tuple(value.shape) != (sae.cfg.d_sae,):
        raise ValueError(f"value has shape {tuple(value.shape)}; give one value per feature [{sae.cfg.d_sae}]")
    return sweep_features(model, tokens, attention_mask, metric, sae, axes, features, value, None, reduce,
                          memory_budget, progress, reuse_prefix, bands, fwd_hooks)


def sweep_features(model, tokens, attention_mask, metric, sae, axes, features, source, clean_cache, reduce,
                   memory_budget, progress, reuse_prefix, bands, fwd_hooks) -> PatchResult:
    axes = tuple(axes)
    if axes not in AXES:
        raise ValueError(f"feature sweep axes are ('pos', 'feature') or ('feature',), got {axes!r}")
    layer = spliced_layer(model, sae)
    ids = feature_ids(features, sae.cfg.d_sae)
    sweep = FeatureSweep(model, tokens, attention_mask, metric, reduce, memory_budget, progress, reuse_prefix, bands,
                         d_sae=sae.cfg.d_sae)
    name = acts_name(sae)
    shape = (sweep.n_prompts, sweep.seq_len, sae.cfg.d_sae)
    if source == "patch":
        if not isinstance(clean_cache, Mapping):
            raise TypeError(f"clean_cache must be a mapping hook name -> tensor, got {type(clean_cache).__name__}")
        check_clean(clean_cache, name, shape)
    with user_hooks(model, fwd_hooks, sweep.n_prompts) as hooked:
        sweep.honour_user_hooks(hooked)
        return run(sweep, sae, layer, name, axes, ids, source, clean_cache)


def run(sweep: FeatureSweep, sae: SAE, layer: int, name: str, axes: tuple, ids: list, source, clean_cache) -> PatchResult:
    model, device = sweep.model, sweep.device
    positions = range(sweep.seq_len) if "pos" in axes else [None]
    # (layer, pos, feature): the engine's planner sorts by the first entry, its layer
    variants = [(layer, p, f) for p, f in itertools.product(positions, ids)]
    firsts = [p if (p is not None and sweep.reuse_prefix) else 0 for _, p, _ in variants]
    sweep.ensure_base([name])
    base_acts = sweep.base.acts[name]
    dtype = base_acts.dtype
    if source == "patch":
        values = clean_cache[name].to(device, dtype)
    elif source == "zero":
        values = torch.zeros(sae.cfg.d_sae, device=device, dtype=dtype)
    elif source == "mean":
        keep = sweep.key_mask if sweep.key_mask is not None else torch.ones(base_acts.shape[:2], dtype=torch.bool,
                                                                              device=device)
        keep = keep.to(device, dtype)[..., None]
        values = (base_acts * keep).sum((0, 1)) / keep.sum((0, 1))
    else:
        values = source.to(device, dtype)
    mask_axes = ("layer",) + axes
    index_rows = [(0, p, f) if "pos" in axes else (0, f) for _, p, f in variants]
    index = torch.tensor(index_rows, dtype=torch.long, device=device)
    act_axes = ["pos", "feature"]

    def make_hooks(first: int, members: Tensor):
        def hooks(at_layer: int, n_before: int) -> list:
            if at_layer != layer:
                return []
            count = members.shape[0]
            mask = patch_mask(index[members], mask_axes, act_axes, (sweep.seq_len, sae.cfg.d_sae), first)
            span = values[:, first:] if values.ndim == 3 else values
            return [(name, patch_rows(mask, span, n_before, count, sweep.n_prompts))]
        return hooks

    readout = Readout(model, sweep.base, sweep.metric, sweep.read_pos, len(variants), sweep.memory_budget,
                      sweep.full_readout)
    bar = progress_bar(len(variants), name, sweep.progress)
    try:
        with torch.no_grad():
            plan = sweep.passes(variants, firsts, False)
            all_ids = torch.tensor([i for _, members in plan for i in members], dtype=torch.long, device=device)
            offset = 0
            for first, members in plan:
                chunk = all_ids[offset: offset + len(members)]
                offset += len(members)
                final = run_staggered(model, sweep.base, first, {layer: len(members)}, make_hooks(first, chunk))
                readout.add(final, first, chunk)
                bar.update(len(members))
            out = readout.result()
    finally:
        bar.close()
    values_out = out.mean(1) if sweep.reduce == "mean" else out
    grid = ([sweep.seq_len] if "pos" in axes else []) + [len(ids)] + ([] if sweep.reduce == "mean" else
                                                                       [sweep.n_prompts])
    names = axes + (() if sweep.reduce == "mean" else ("batch",))
    labels = {"feature": [str(f) for f in ids]}
    if "pos" in axes:
        labels["pos"] = sweep.labels("pos")
    return PatchResult(values_out.reshape(grid), names, labels, name,
                       getattr(sweep.metric, "name", getattr(sweep.metric, "__name__", "")))
