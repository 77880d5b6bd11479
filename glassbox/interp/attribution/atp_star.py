"""AtP* (Kramár et al. 2024, "AtP*: An efficient and scalable method for localizing LLM behaviour to
components"): attribution patching with its two fixes for false negatives.

1. The QK fix (``qk_fix=True``): query and key nodes ("q", "k") are scored with their head's
   attention softmax recomputed exactly (``atp_qk.py``), since a linearised softmax misses most of
   a saturated pattern's change. Other nodes are scored as AtP scores them.
2. GradDrop (``grad_drop=True``): AtP sums the effects of all paths from a node to the metric to
   first order, so a direct and an indirect effect of opposite sign can cancel in the estimate
   while the true (non-linear) effect does not cancel. GradDrop runs L backward passes over one
   corrupted forward; in pass l the gradient through layer l's residual-stream writes
   (``blocks.l.hook_attn_out`` and ``hook_mlp_out``) is zeroed, i.e. the metric's gradient with a
   stop-gradient on what block l adds to the residual stream. With I_l(n) the node's (QK-fixed)
   estimate from pass l, the score is the paper's eq. 11:

       c(n) = 1/(L-1) * sum_{l=1..L} |I_l(n)|     (per prompt, then the mean over prompts)

   Why this form: each pass removes the paths through one layer, so an effect hidden by
   cancellation between paths through different layers shows in some |I_l|. A node inside block
   l (a head, an MLP) reaches the metric only through block l's writes, so its I_l is 0: L-1
   passes carry it, hence the 1/(L-1) (a node none of whose paths cancel then scores about |I|).

So with GradDrop the result holds magnitudes (>= 0, in the metric's units), estimates of
|patched metric - metric(corrupted)| to rank nodes by, not patched metric values; without it the
values are metric(corrupted) + the (QK-fixed) effect, comparable with the exact sweep as AtP's are.
A VariantMetric takes the absolute value of its whole-batch effect. GradDrop needs >= 2 layers.
"""

import re
from collections.abc import Mapping
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..patching.result import PatchResult
from .atp import plan
from .atp_qk import check_qk, qk_effect
from .atp_run import flags_on, gate_hooks, node_scores


def attribution_patch_star(model, clean_tokens, corrupted_tokens, metric: Callable,
                           activation: Union[str, Sequence[str]], axes: Sequence[str], *,
                           qk_fix: bool = True, grad_drop: bool = True, clean_cache: Optional[Mapping] = None,
                           corrupted_cache: Optional[Mapping] = None, attention_mask: Optional[Tensor] = None,
                           hook_axes: Optional[Sequence[str]] = None, reduce: Optional[str] = "mean",
                           progress: bool = False) -> PatchResult:
    """AtP* over the nodes ``attribution_patch`` takes (same arguments, same axes and labels).

    Args:
        qk_fix: score "q" and "k" nodes with the attention softmax recomputed exactly.
        grad_drop: L backward passes, each with one layer's residual writes cut from the gradient,
            combined as 1/(L-1) sum_l |estimate_l| (values are then magnitudes; module docstring).
        progress: a tqdm bar over the backward passes.
    Returns:
        PatchResult; its name ends in " (AtP* |effect|)" when the values are GradDrop magnitudes.
    """
    for flag, value in (("qk_fix", qk_fix), ("grad_drop", grad_drop), ("progress", progress)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {value!r}")
    run = plan(model, clean_tokens, corrupted_tokens, metric, activation, axes, hook_axes, reduce, attention_mask)
    n_layers = model.cfg.n_layers
    if grad_drop and n_layers < 2:
        raise ValueError("GradDrop averages over the L-1 layers other than a node's own (1/(L-1)); this model has "
                         f"n_layers={n_layers}: use grad_drop=False")
    fixed = [spec for spec in run.specs if qk_fix and (spec.is_attention("q") or spec.is_attention("k"))]
    for spec in run.specs:
        single = [n for n in spec.names if re.fullmatch(r"blocks\.\d+\.attn\.hook_[qk]", n)]
        if qk_fix and not spec.layered and single:
            raise ValueError(f"the QK fix takes queries and keys as the per-layer activations 'q' and 'k'; "
                             f"{single[0]!r} given as one hook name would be scored without it. Pass 'q' or 'k' "
                             "(with a 'layer' axis), or qk_fix=False for plain AtP of this hook")
    for spec in fixed:
        check_qk(model, spec)
    qk_layers = list(range(n_layers)) if fixed else []
    patterns = [f"blocks.{layer}.attn.hook_pattern" for layer in qk_layers]
    qk_values: dict = {}
    keep_qk = lambda act, hook: qk_values.__setitem__(hook.name, act.detach())
    qk_hooks = [(f"blocks.{layer}.attn.hook_{p}", keep_qk) for layer in qk_layers for p in "qk"]
    state: dict = {"drop": None}
    extra_hooks = qk_hooks + (gate_hooks(model, state) if grad_drop else [])
    passes = list(range(n_layers)) if grad_drop else [None]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(passes), desc="AtP* backward passes", disable=not progress, leave=False)
    try:
        with flags_on(model, run.flags):
            base, objective, inputs, clean, acts = run.forward(clean_cache, corrupted_cache, patterns, extra_hooks)
            names = list(inputs)
            totals = [None] * len(run.specs)
            for i, drop in enumerate(passes):
                state["drop"] = drop
                grads = torch.autograd.grad(objective, [inputs[n] for n in names], allow_unused=True,
                                            retain_graph=i < len(passes) - 1)
                grads = dict(zip(names, grads))
                for j, spec in enumerate(run.specs):
                    effect = estimate(model, run, spec, spec in fixed, clean, acts, qk_values, grads)
                    if grad_drop:
                        effect = effect.sum(0, keepdim=True).abs() if run.variant else effect.abs()
                    totals[j] = effect if totals[j] is None else totals[j] + effect
                bar.update(1)
    finally:
        bar.close()
    if not grad_drop:
        return run.result(base, totals)
    return run.result(base, [t / (n_layers - 1) for t in totals], combine=False, suffix=" (AtP* |effect|)")


def estimate(model, run, spec, qk: bool, clean: dict, acts: dict, qk_values: dict, grads: dict) -> Tensor:
    """[batch (layer) *node_axes] effects of one spec under one backward pass's gradients."""
    if not qk:
        return node_scores(spec, clean, acts, grads)
    out = []
    for layer, name in enumerate(spec.names):
        q, k = qk_values[f"blocks.{layer}.attn.hook_q"], qk_values[f"blocks.{layer}.attn.hook_k"]
        grad = grads.get(f"blocks.{layer}.attn.hook_pattern")
        if grad is None:
            grad = torch.zeros_like(acts[f"blocks.{layer}.attn.hook_pattern"])
        out.append(qk_effect(model, spec, layer, q, k, clean[name], grad, run.tokens, run.key_mask))
    return torch.stack(out, 1)
