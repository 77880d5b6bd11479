"""Attribution patching (AtP): the first-order estimate of every node's activation-patching result
from two forwards and one backward.

``attribution_patch(model, clean_tokens, corrupted_tokens, metric, "z", ("layer", "head"))``
estimates ``activation_patch(model, corrupted_tokens, clean_cache, metric, "z", ("layer", "head"))``
(the metric of the corrupted run with one node set to its clean value, mean over prompts) as

    metric(corrupted) + sum over the node's slice of (a_clean - a_corrupted) * d metric / d a

with the gradient taken on the corrupted run (Nanda 2022; Kramár et al. 2024, eq. 4). Same
``activation`` names, axes, labels and metric objects as the sweeps, so results compare and plot
alike. One clean forward (no grad; skipped when ``clean_cache`` is given), one corrupted forward
keeping every node activation in the graph, and ONE backward for all nodes of all layers at once.

Exact where the metric is linear in the patched activation along the patch (e.g. a linear readout
of the last residual stream); elsewhere an approximation, worst through saturated softmaxes
(attention patterns, the final log-softmax) and for big patches. ``atp_star.py`` fixes the query
and key nodes' softmax (the QK fix) and adds GradDrop.

Metrics: a per-prompt metric (``LogitDiff``, ``TargetLoss``, ``Normalized``, ... or any
``fn(logits) -> [prompt]``) is differentiated through the sum over prompts, which gives each
prompt its own gradient (prompts do not interact); a ``VariantMetric`` (one value for the whole
batch) through its value. ``reduce=None`` keeps a trailing ``batch`` axis, as the sweeps do.

Hook flags a hook needs ("result": use_attn_result; "q_input"/"k_input"/"v_input":
use_split_qkv_input; "mlp_in": use_hook_mlp_in) are turned on for the run and restored after, also
when something raises; every hook attached is removed. A hook HOOK_SHAPES does not know (an SAE's
``...hook_sae_acts_post``) is given by its full name, with ``hook_axes`` naming its axes after batch
(default: ``axes``).
"""

from collections.abc import Mapping
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor

from ..patching.metrics import VariantMetric
from ..patching.result import PatchResult
from .atp_run import (check_clean_values, check_corrupted_cache, check_metric, check_names_exist, clean_activations,
                      corrupted_forward, flags_on, node_scores, prepare_tokens)
from .metric_checks import check_scores
from .nodes import NodeSpec, axis_labels, check_stackable, resolve_nodes

METHODS = ("atp", "atp*")


def attribution_patch(model, clean_tokens, corrupted_tokens, metric: Callable, activation: Union[str, Sequence[str]],
                      axes: Sequence[str], *, clean_cache: Optional[Mapping] = None,
                      corrupted_cache: Optional[Mapping] = None, attention_mask: Optional[Tensor] = None,
                      hook_axes: Optional[Sequence[str]] = None, reduce: Optional[str] = "mean",
                      method: str = "atp", progress: bool = False, **star_options) -> PatchResult:
    """The AtP estimate of ``activation_patch(model, corrupted_tokens, clean_cache, metric, activation, axes)``.

    Args:
        clean_tokens, corrupted_tokens: token ids [prompt pos] of one shape (or text, padded alike).
        metric: ``fn(logits [prompt pos d_vocab]) -> [prompt]`` (the patching metrics), or a
            ``VariantMetric``; it must be differentiable in the logits.
        activation: a name from ``ATP_ACTIVATIONS``, a template with ``{L}``, a full hook name, or a
            list of them (stacked on a leading ``component`` axis; one forward and one backward for all).
        axes: ("layer", ...) then the hook's axes that index nodes, in the result's order ("pos",
            "head", "kv_head", "query_pos", "key_pos", "neuron", ...); other axes are summed (the
            node is the whole slice). A full hook name has no "layer".
        clean_cache: hook name -> clean activation; None runs the clean forward.
        corrupted_cache: hook name -> corrupted activation, checked against the gradient run (which
            must recompute the corrupted run anyway, for its gradient); a mismatch is refused.
        hook_axes: the axes after batch of a hook HOOK_SHAPES does not know (default ``axes``).
        reduce: "mean" over prompts, or None for a trailing ``batch`` axis.
        method: "atp", or "atp*" for ``attribution_patch_star`` (``star_options`` go to it).
        progress: a tqdm bar over backward passes (AtP* with GradDrop; AtP has one).
    Returns:
        PatchResult with the sweep's axes and labels; values are estimated metrics of the patched runs.
    """
    if method in ("atp*", "atp_star"):
        from .atp_star import attribution_patch_star

        return attribution_patch_star(model, clean_tokens, corrupted_tokens, metric, activation, axes,
                                      clean_cache=clean_cache, corrupted_cache=corrupted_cache,
                                      attention_mask=attention_mask, hook_axes=hook_axes, reduce=reduce,
                                      progress=progress, **star_options)
    if method != "atp":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if star_options:
        raise TypeError(f"unexpected options {sorted(star_options)} (they belong to method='atp*')")
    run = plan(model, clean_tokens, corrupted_tokens, metric, activation, axes, hook_axes, reduce, attention_mask)
    with flags_on(model, run.flags):
        base, objective, grad_inputs, clean, acts = run.forward(clean_cache, corrupted_cache)
        names = list(grad_inputs)
        grads = dict(zip(names, torch.autograd.grad(objective, [grad_inputs[n] for n in names], allow_unused=True)))
        effects = [node_scores(spec, clean, acts, grads) for spec in run.specs]
    return run.result(base, effects)


class Run:
    """One attribution run's inputs, checked before any forward, and the assembling of its result."""

    def __init__(self, model, specs: list, stacked: bool, clean, corrupted, key_mask, metric, reduce):
        self.model, self.specs, self.stacked = model, specs, stacked
        self.clean_tokens, self.tokens, self.key_mask = clean, corrupted, key_mask
        self.metric, self.reduce = metric, reduce
        self.variant = isinstance(metric, VariantMetric)
        self.flags = sorted({spec.flag for spec in specs if spec.flag is not None})

    @property
    def names(self) -> list:
        return list(dict.fromkeys(name for spec in self.specs for name in spec.names))

    def forward(self, clean_cache, corrupted_cache, extra_names=(), extra_hooks=()) -> tuple:
        """(corrupted metric values, objective, name -> activation to differentiate, clean values,
        corrupted values); ``extra_names`` are kept in the graph too (e.g. attention patterns)."""
        model = self.model
        check_names_exist(model, self.specs)
        clean = clean_activations(model, self.clean_tokens, self.key_mask, self.names, clean_cache)
        base, objective, acts = corrupted_forward(model, self.tokens, self.key_mask, self.metric,
                                                  self.names + list(extra_names), extra_hooks)
        n_prompts, seq_len = self.tokens.shape
        check_clean_values(model, self.specs, clean, acts, n_prompts, seq_len)
        check_corrupted_cache(corrupted_cache, self.names, acts)
        return base, objective, {name: acts[name] for name in self.names + list(extra_names)}, clean, acts

    def combine(self, base: Tensor, effect: Tensor) -> Tensor:
        """Per prompt: base + effect; mean over prompts (or kept, trailing) ; a VariantMetric sums."""
        if self.variant:
            return base + effect.sum(0)
        shape = (-1,) + (1,) * (effect.ndim - 1)
        values = base.reshape(shape).to(effect.dtype) + effect
        return values.mean(0) if self.reduce == "mean" else values.movedim(0, -1)

    def magnitudes(self, score: Tensor) -> Tensor:
        """Per-prompt scores [batch ...] reduced as results are (mean, or kept trailing)."""
        if self.variant:
            return score.sum(0)
        return score.mean(0) if self.reduce == "mean" else score.movedim(0, -1)

    def result(self, base: Tensor, effects: list, combine: bool = True, suffix: str = "") -> PatchResult:
        for spec, effect in zip(self.specs, effects):
            check_scores(self.metric, effect, None, lambda i, spec=spec, shape=tuple(effect.shape):
                         node_label(spec, shape, i))
        values = [self.combine(base, e) if combine else self.magnitudes(e) for e in effects]
        metric_name = getattr(self.metric, "name", getattr(self.metric, "__name__", ""))
        results = [self.labelled(spec, v, metric_name, suffix) for spec, v in zip(self.specs, values)]
        if not self.stacked:
            return results[0]
        shapes = {r.shape for r in results}
        if len(shapes) != 1:
            raise ValueError(f"stacked activations have node grids of different shapes {sorted(shapes)}: "
                             f"{', '.join(s.activation for s in self.specs)}")
        first = results[0]
        return PatchResult(torch.stack([r.values for r in results]), ("component",) + first.axes,
                           {"component": [r.name for r in results], **first.labels},
                           "+".join(r.name for r in results), metric_name)

    def labelled(self, spec: NodeSpec, values: Tensor, metric_name: str, suffix: str) -> PatchResult:
        axes = spec.axes + (() if self.reduce == "mean" or self.variant else ("batch",))
        labels = {a: axis_labels(self.model, a, n, self.tokens) for a, n in zip(spec.axes, values.shape)}
        return PatchResult(values, axes, labels, spec.activation + suffix, metric_name)


def node_label(spec: NodeSpec, shape: tuple, flat_index: int) -> str:
    """'z at (batch 0, layer 1, head 2)': one element of a per-prompt effect [batch *axes]."""
    axes = ("batch",) + tuple(spec.axes)
    index, rest = [], flat_index
    for size in reversed(shape):
        index.append(rest % size)
        rest //= size
    return f"{spec.activation} at ({', '.join(f'{a} {i}' for a, i in zip(axes, reversed(index)))})"


def plan(model, clean_tokens, corrupted_tokens, metric, activation, axes, hook_axes, reduce, attention_mask) -> Run:
    """Every argument checked (names, axes, tokens, metric) before any forward runs."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError("attribution patching needs gradients, which torch.inference_mode() forbids; call it "
                           "outside that block (torch.no_grad() around it is fine: gradients are turned on where "
                           "they are needed)")
    stacked = not isinstance(activation, str)
    if stacked:
        activation = list(activation)
        if not activation:
            raise ValueError("activation is an empty list")
    specs = [resolve_nodes(model, a, axes, hook_axes) for a in (activation if stacked else [activation])]
    if stacked:
        check_stackable(specs)
    clean, corrupted, key_mask = prepare_tokens(model, clean_tokens, corrupted_tokens, attention_mask)
    check_metric(model, metric, corrupted.shape[0], corrupted.shape[1], reduce, corrupted.device)
    return Run(model, specs, stacked, clean, corrupted, key_mask, metric, reduce)
