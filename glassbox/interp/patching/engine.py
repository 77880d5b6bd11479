"""Activation patching: the one generic, batched engine behind every named sweep.

``activation_patch(model, corrupted_tokens, clean_cache, metric, "resid_pre", ("layer", "pos"))``
runs the corrupted tokens once per variant (every layer x position here), each time replacing one
slice of one activation by its value in ``clean_cache``, and returns the metric of every variant as
a ``PatchResult`` [layer pos]. The meaning is TransformerLens's ``generic_activation_patch``; the
metric differs in returning one value per prompt (see ``metrics.py``), and the result is its mean
over prompts (``reduce=None`` keeps a trailing ``batch`` axis). TransformerLens's own contract, a
metric of each variant's whole batch of logits to one scalar, is ``VariantMetric(fn)``.

How it is fast, and why each step is exact (``runner.py`` has the causal argument):
- variants run side by side along the batch axis, in passes sized by ``memory_budget`` (bytes,
  estimated); in a pass each variant joins the batch at its patched layer, starting from the
  cached corrupted residual stream there, so earlier layers are never recomputed and every layer's
  weights are read once per pass;
- with ``bands`` > 1 (and ``reuse_prefix``), variants are split by first patched position into that
  many groups; a group patching positions >= p computes positions p: only, reusing the corrupted
  keys/values before p. Each group costs one more read of the weights, so the default (None) takes
  one band per 4 positions, at most 16;
- a ``PositionMetric`` gets logits unembedded at its one read position per prompt, for many passes
  at once; any other metric gets full logits [batch pos d_vocab];
- masks, clean values and results stay on the model's device; nothing waits on the device in the loop.

Contract: ``clean_cache`` is any mapping hook name -> activation of the clean run with the corrupted
run's shape (an ``ActivationCache`` or a dict). Hooks are attached only while one block of a pass
runs and are removed even when a hook, the metric or a KeyboardInterrupt interrupts; weights are
never written.

User hooks (forward hooks on the model when a sweep starts, or ``fwd_hooks=``) are honoured: the
result equals a one-patch-per-forward loop run under the same hooks, at any ``memory_budget``. Each
user hook is called per variant on the loop's batch of prompts, every position is computed (the
prefix reuse is off) and, when the final norm is hooked, the readout takes full logits; the user's
hooks run before the patch at one hook point. ``user_hooks.py`` has the details and what a hook
must be (a function of activation, hook and ``hook.ctx``, not of how often it is called).
"""

import itertools
import math
from collections.abc import Mapping
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor

from ...hooks import unknown_name_message
from ...models.hook_shapes import axis_sizes, hook_shape
from .metrics import PositionMetric, VariantMetric
from .readout import Readout
from .result import PatchResult
from .runner import base_run, run_staggered
from .user_hooks import readout_hooked, user_hooks

ACTIVATIONS = {
    "resid_pre": "blocks.{L}.hook_resid_pre", "resid_mid": "blocks.{L}.hook_resid_mid",
    "resid_post": "blocks.{L}.hook_resid_post", "attn_out": "blocks.{L}.hook_attn_out",
    "mlp_out": "blocks.{L}.hook_mlp_out", "q": "blocks.{L}.attn.hook_q", "k": "blocks.{L}.attn.hook_k",
    "v": "blocks.{L}.attn.hook_v", "z": "blocks.{L}.attn.hook_z", "pattern": "blocks.{L}.attn.hook_pattern",
    "attn_scores": "blocks.{L}.attn.hook_attn_scores", "mlp_pre": "blocks.{L}.mlp.hook_pre",
    "mlp_post": "blocks.{L}.mlp.hook_post",
}
PATCH_AXES = ("pos", "head", "kv_head", "query_pos", "key_pos")
SPAN_AXES = ("pos", "query_pos")  # activation axes a pass computes only from its first position on
DEFAULT_MEMORY_BUDGET = 2**30
DEFAULT_BANDS = None  # automatic: one per 4 positions, at most 16 (measured best on GPT-2 small, CPU)
Metric = Callable[[Tensor], Tensor]


def activation_patch(model, corrupted_tokens: Union[Int[Tensor, "batch pos"], str, list], clean_cache: Mapping,
                     metric: Metric, activation: Union[str, Sequence[str]], axes: Sequence[str], *,
                     attention_mask: Optional[Tensor] = None, reduce: Optional[str] = "mean",
                     memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool = False,
                     reuse_prefix: bool = True, bands: Optional[int] = DEFAULT_BANDS,
                     fwd_hooks: Sequence = ()) -> PatchResult:
    """Patch ``activation`` from ``clean_cache`` into the corrupted run, one variant per grid point.

    Args:
        activation: a name from ``ACTIVATIONS`` or a hook-name template with ``{L}``; a list of them
            stacks their sweeps along a leading ``component`` axis (all share one corrupted run).
        axes: ``("layer", ...)`` then the activation's axes to index, in the result's order, from
            ``pos head query_pos key_pos``; axes not named are patched whole.
        metric: ``fn(logits [batch pos d_vocab]) -> [batch]``; row r is prompt r % n_prompts. Or a
            ``VariantMetric``: ``fn(logits [prompt pos d_vocab]) -> scalar`` per variant, whose values
            the result holds as they are (no mean; reduce=None is refused).
        reduce: "mean" over prompts, or None for a trailing ``batch`` axis.
        memory_budget: bytes one pass, or one batch of logits, may use (estimated).
        progress: show a tqdm bar over variants.
        reuse_prefix, bands: the position-prefix reuse described in the module docstring.
        fwd_hooks: (name_or_filter, fn) forward hooks attached for the whole sweep, honoured like
            hooks already on the model (``user_hooks.py``).
    """
    sweep = Sweep(model, corrupted_tokens, attention_mask, metric, reduce, memory_budget, progress,
                  reuse_prefix, bands)
    if not isinstance(activation, str) and not activation:
        raise ValueError("activation is an empty list")
    if not isinstance(activation, str):
        check_stackable(model, list(activation), tuple(axes))
    with user_hooks(model, fwd_hooks, sweep.n_prompts) as hooked:
        sweep.honour_user_hooks(hooked)
        if isinstance(activation, str):
            return sweep.run(clean_cache, activation, tuple(axes))
        results = [sweep.run(clean_cache, a, tuple(axes)) for a in activation]
    first = results[0]
    return PatchResult(torch.stack([r.values for r in results]), ("component",) + first.axes,
                       {"component": [r.name for r in results], **first.labels},
                       "+".join(r.name for r in results), first.metric)


class Sweep:
    """One corrupted run, reused by any number of sweeps over it."""

    def __init__(self, model, corrupted_tokens, attention_mask, metric, reduce, memory_budget, progress,
                 reuse_prefix, bands):
        if not callable(metric):
            raise TypeError(f"metric must be callable: fn(logits) -> one value per row, got {type(metric).__name__}")
        if reduce not in ("mean", None):
            raise ValueError(f"reduce must be 'mean' or None, got {reduce!r}")
        if reduce is None and isinstance(metric, VariantMetric):
            raise ValueError("reduce=None keeps one value per prompt, but a VariantMetric gives one value per "
                             "variant (of all prompts together); leave reduce='mean'")
        if not (isinstance(memory_budget, int) and memory_budget > 0):
            raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
        if bands is not None and not (isinstance(bands, int) and bands > 0):
            raise ValueError(f"bands must be a positive int or None, got {bands!r}")
        tokens, key_mask = model.input_to_tokens(corrupted_tokens, attention_mask, None, "right")
        model.check_tokens(tokens)
        self.model, self.metric, self.reduce, self.progress = model, metric, reduce, progress
        self.memory_budget, self.reuse_prefix, self.bands = memory_budget, reuse_prefix, bands
        self.tokens, self.key_mask = tokens, key_mask
        self.n_prompts, self.seq_len = tokens.shape
        if bands is None:  # each band reads the weights once more; on short prompts that outweighs the saving
            self.bands = min(16, max(1, self.seq_len // 4))
        self.device = tokens.device
        self.read_pos = None
        if isinstance(metric, PositionMetric):  # validated once, here
            self.read_pos = metric.positions(self.n_prompts, self.seq_len, self.device)
            metric.check_vocab(model.cfg.d_vocab)
        self.base = None
        self.full_readout = False

    def honour_user_hooks(self, hooked: bool) -> None:
        """Under user hooks, compute every position (hooks see true indices) and, when the final
        norm or unembedding is hooked, read out full logits through them."""
        if hooked:
            self.reuse_prefix = False
            self.full_readout = readout_hooked(self.model)

    # -- planning ----------------------------------------------------------------------------
    def sizes(self, axis: str) -> int:
        cfg = self.model.cfg
        return axis_sizes(cfg, self.n_prompts, self.seq_len)[axis]

    def labels(self, axis: str) -> list:
        if axis in ("pos", "query_pos", "key_pos"):
            return position_labels(self.model, self.tokens[0])
        if axis == "kv_head":  # which query heads read each key/value head
            g = self.model.cfg.n_kv_groups
            return [f"{i} (q {i * g}-{i * g + g - 1})" if g > 1 else str(i) for i in range(self.sizes(axis))]
        return [str(i) for i in range(self.sizes(axis))]

    def row_bytes(self, span: int, materialised: bool) -> int:
        """Estimated peak bytes per batch row while a block computes ``span`` positions."""
        cfg = self.model.cfg
        elt = torch.finfo(next(self.model.parameters()).dtype).bits // 8
        per_pos = 8 * cfg.d_model + 2 * cfg.d_mlp + 4 * cfg.n_heads * cfg.d_head
        per_pos += cfg.n_heads * self.seq_len * (2 if materialised else 1)  # scores (and pattern)
        return span * per_pos * elt + 2 * self.seq_len * cfg.d_model * elt  # + prefix keys/values

    def variants_per_pass(self, span: int, materialised: bool) -> int:
        return max(1, self.memory_budget // (self.row_bytes(span, materialised) * self.n_prompts))

    def passes(self, variants: list, firsts: list, materialised: bool) -> list:
        """(first, variant ids sorted by layer) of every pass: bands by first position, each split
        round-robin into passes that fit the budget (round-robin keeps every layer in every pass)."""
        by_first = sorted(range(len(variants)), key=lambda i: firsts[i])
        n_bands = min(self.bands, len(set(firsts))) if self.reuse_prefix else 1
        size = math.ceil(len(by_first) / n_bands)
        plan = []
        for lo in range(0, len(by_first), size):
            band = by_first[lo: lo + size]
            first = firsts[band[0]] if self.reuse_prefix else 0
            n_passes = math.ceil(len(band) / self.variants_per_pass(self.seq_len - first, materialised))
            band = sorted(band, key=lambda i: variants[i][0])
            plan += [(first, band[k::n_passes]) for k in range(n_passes)]
        return plan

    # -- running -----------------------------------------------------------------------------
    def ensure_base(self, names=()) -> None:
        if self.base is None or any(name not in self.base.acts for name in names):
            self.base = base_run(self.model, self.tokens, self.key_mask, names)

    def run(self, clean_cache: Mapping, activation: str, axes: tuple) -> PatchResult:
        model, n_layers = self.model, self.model.cfg.n_layers
        template = resolve_template(model, activation)
        act_axes = hook_shape(template.format(L=0), model.hook_flags, model.cfg).split()[1:]  # without batch
        check_axes(axes, act_axes, template, model.cfg)
        if not isinstance(clean_cache, Mapping):
            raise TypeError(f"clean_cache must be a mapping hook name -> tensor, got {type(clean_cache).__name__}")
        shape = self.expected_shape(act_axes)
        for layer in range(n_layers):
            check_clean(clean_cache, template.format(L=layer), shape)
        variants = list(itertools.product(*(range(self.sizes(a)) for a in axes)))
        firsts = [self.first_position(dict(zip(axes, v))) for v in variants]
        self.ensure_base()
        index = torch.tensor(variants, dtype=torch.long, device=self.device)  # one copy to the device
        materialised = template.endswith(("hook_pattern", "hook_attn_scores"))
        dtype = self.base.resid_pre(0).dtype
        clean = {}  # layer -> clean activation on the device, moved once

        def make_hooks(first: int, ids: Tensor, start: dict):
            def hooks(layer: int, n_before: int) -> list:
                if layer not in start:  # no variant of this pass patches this layer
                    return []
                if layer not in clean:
                    clean[layer] = clean_cache[template.format(L=layer)].to(self.device, dtype)
                count = start[layer][1] - start[layer][0]
                mask = patch_mask(index[ids[start[layer][0]: start[layer][1]]], axes, act_axes,
                                  clean[layer].shape[1:], first)
                span = (slice(None), *(slice(first, None) if a in SPAN_AXES else slice(None) for a in act_axes))
                return [(template.format(L=layer), patch_rows(mask, clean[layer][span], n_before, count,
                                                              self.n_prompts))]
            return hooks

        readout = Readout(model, self.base, self.metric, self.read_pos, len(variants), self.memory_budget,
                          self.full_readout)
        bar = progress_bar(len(variants), activation, self.progress)
        try:
            with torch.no_grad():
                plan = self.passes(variants, firsts, materialised)
                # Every pass's variant ids go to the device in one copy, then are only sliced.
                all_ids = torch.tensor([i for _, members in plan for i in members], dtype=torch.long,
                                       device=self.device)
                offset = 0
                for first, members in plan:
                    joining, start = {}, {}
                    for k, i in enumerate(members):
                        layer = variants[i][0]
                        joining[layer] = joining.get(layer, 0) + 1
                        start[layer] = (start.get(layer, (k, k))[0], k + 1)
                    ids = all_ids[offset: offset + len(members)]
                    offset += len(members)
                    final = run_staggered(model, self.base, first, joining, make_hooks(first, ids, start))
                    readout.add(final, first, ids)
                    bar.update(len(members))
                out = readout.result()
        finally:
            bar.close()
        values = out.mean(1) if self.reduce == "mean" else out
        grid = [self.sizes(a) for a in axes] + ([] if self.reduce == "mean" else [self.n_prompts])
        names = axes + (() if self.reduce == "mean" else ("batch",))
        labels = {a: self.labels(a) for a in axes}
        return PatchResult(values.reshape(grid), names, labels, activation,
                           getattr(self.metric, "name", getattr(self.metric, "__name__", "")))

    def first_position(self, index: dict) -> int:
        if not self.reuse_prefix:
            return 0
        for axis in SPAN_AXES:
            if axis in index:
                return index[axis]
        return 0

    def expected_shape(self, act_axes: list) -> tuple:
        cfg = self.model.cfg
        dims = axis_sizes(cfg, self.n_prompts, self.seq_len)
        return (self.n_prompts, *(int(a) if a.isdigit() else dims[a] for a in act_axes))


def patch_rows(mask: Tensor, clean: Tensor, n_before: int, count: int, n_prompts: int):
    """A hook replacing, in the rows of the ``count`` variants after the first ``n_before``, the
    slices ``mask`` selects by the clean values (rows of earlier variants pass through)."""
    skip = n_before * n_prompts

    def patch(act: Tensor, hook) -> Tensor:
        tail = torch.where(mask, clean, act[skip:].unflatten(0, (count, n_prompts))).flatten(0, 1)
        return torch.cat([act[:skip], tail]) if skip else tail

    return patch


def patch_mask(index: Tensor, axes: tuple, act_axes: list, act_shape: tuple, first: int) -> Tensor:
    """Bool [variant 1 *act_dims]: True on the slice each variant replaces.

    Built on the device from the variants' indices, so making it never waits on the device. Axes not
    indexed by the sweep have size 1 (patched whole); position axes are shifted to the chunk's span.
    """
    n = index.shape[0]
    mask = torch.ones((n, 1) + (1,) * len(act_axes), dtype=torch.bool, device=index.device)
    for k, axis in enumerate(axes[1:], start=1):
        dim = act_axes.index(axis)
        size = act_shape[dim] - (first if axis in SPAN_AXES else 0)
        target = index[:, k] - (first if axis in SPAN_AXES else 0)
        hit = torch.arange(size, device=index.device)[None, :] == target[:, None]  # [variant size]
        shape = [n, 1] + [1] * len(act_axes)
        shape[2 + dim] = size
        mask = mask & hit.view(shape)
    return mask


def check_activation(activation: str, known: Optional[Mapping] = None, full_names: bool = False) -> str:
    """The hook-name template of ``activation`` (a key of ``known``, default ``ACTIVATIONS``, or a template
    with ``{L}``; with ``full_names`` also one hook name), checked without a model against HOOK_SHAPES,
    so that a job can refuse a misspelt name before it starts. ValueError for an unknown word, KeyError
    for a name no model has; each names the closest valid ones. Whether this model has the hook is for
    ``resolve_template`` (or the attribution's ``resolve_nodes``) to say."""
    from ...models.hook_shapes import HOOK_SHAPES, hook_pattern
    from ...suggest import did_you_mean

    known = ACTIVATIONS if known is None else known
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string, got {type(activation).__name__}")
    template = known.get(activation, activation)
    layered = "{L}" in template
    if not layered and not (full_names and ("." in template or template in HOOK_SHAPES)):
        also = ", a hook name template containing {L}" + (", or a full hook name" if full_names else "")
        raise ValueError(f"unknown activation {activation!r}{did_you_mean(activation, known)}: give one of "
                         f"{', '.join(known)}{also}")
    pattern = hook_pattern(template.replace("{L}", "0"))
    if pattern not in HOOK_SHAPES:
        raise KeyError(f"unknown hook name {template!r}: no model has {pattern!r}"
                       f"{did_you_mean(pattern, HOOK_SHAPES)}")
    return template


def resolve_template(model, activation: str) -> str:
    template = ACTIVATIONS.get(activation, activation)
    if "{L}" not in template:
        from ...suggest import did_you_mean

        raise ValueError(f"unknown activation {activation!r}{did_you_mean(activation, ACTIVATIONS)}: give one of "
                         f"{', '.join(ACTIVATIONS)} or a hook name template containing {{L}}")
    name = template.format(L=0)
    if name not in model.hook_dict:
        raise KeyError(unknown_name_message(name, model.hook_dict))
    return template


def check_axes(axes: tuple, act_axes: list, template: str, cfg=None) -> None:
    if not axes or axes[0] != "layer":
        raise ValueError(f"sweep axes start with 'layer', got {axes!r}")
    indexable = [a for a in act_axes if a in PATCH_AXES]
    for axis in axes[1:]:
        if axis == "head" and "kv_head" in act_axes:
            raise ValueError(f"{template} has a kv_head axis, not head: this model's {cfg.n_heads} query heads share "
                             f"n_key_value_heads={cfg.n_key_value_heads} key/value heads (grouped-query attention). "
                             "Sweep 'kv_head' (each kv head at once for all the query heads that read it), or build "
                             "the model with ungroup_grouped_query_attention=True for keys and values per query head")
        if axis not in indexable:
            raise ValueError(f"axis {axis!r} cannot be swept for {template} ({' '.join(act_axes)}); "
                             f"choose from {indexable}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"sweep axes repeat: {axes!r}")


def check_stackable(model, activations: list, axes: tuple) -> None:
    """Stacked sweeps share one grid: refuse (before any forward) an activation whose head axis is
    kv_head (keys and values under grouped-query attention) in a grid over query heads."""
    for activation in activations:
        template = resolve_template(model, activation)
        act_axes = hook_shape(template.format(L=0), model.hook_flags, model.cfg).split()[1:]
        if "head" in axes and "kv_head" in act_axes:
            cfg = model.cfg
            raise ValueError(f"a stacked sweep of {', '.join(map(str, activations))} shares one head axis, but "
                             f"{template} has n_key_value_heads={cfg.n_key_value_heads} kv heads, not n_heads="
                             f"{cfg.n_heads} (grouped-query attention): sweep keys and values on their own "
                             "(patch_head_k / patch_head_v and their _by_pos forms sweep kv heads), or build the "
                             "model with ungroup_grouped_query_attention=True")
        check_axes(axes, act_axes, template, model.cfg)


def check_clean(clean_cache: Mapping, name: str, shape: tuple) -> None:
    if name not in clean_cache:
        raise KeyError(f"clean cache has no {name!r}; cache it in the clean run (e.g. names_filter)")
    value = clean_cache[name]
    if not isinstance(value, Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"clean {name} has shape {got}; the corrupted run's is {shape} (same prompts count "
                         "and length, with the batch axis)")


def position_labels(model, tokens: Tensor) -> list:
    """String tokens of one prompt when the model has a tokenizer, else position numbers."""
    try:
        return [str(t) for t in model.to_str_tokens(tokens)]
    except ValueError:
        return [str(i) for i in range(tokens.shape[0])]


def progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"patching {desc}", disable=not enabled, leave=False)
