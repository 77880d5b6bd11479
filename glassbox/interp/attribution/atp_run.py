"""The runs behind attribution patching: the inputs checked, hook flags on for the run, the clean
activations, and the corrupted forward whose node activations stay in the autograd graph.

Contract: every hook attached here is attached through ``model.hooks`` (removed when the block
ends, also when something raises); flags turned on are turned back off in a ``finally``; weights
are never written and their ``requires_grad`` is left alone (a node activation that does not need
a gradient upstream, e.g. with frozen weights, is made a leaf that does).

Footgun: user hooks already on the model run in both forwards (the clean and the corrupted run),
so the estimate is of the model under those hooks, as a sweep honours them.
"""

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Optional

import torch
from torch import Tensor

from ...models import devices
from ..patching.metrics import PositionMetric, VariantMetric
from ..patching.user_hooks import readout_hooked
from .metric_checks import check_has_grad, check_reads_logits, check_values, metric_name
from .nodes import NodeSpec, check_act, expected_shape


def prepare_tokens(model, clean_tokens, corrupted_tokens, attention_mask) -> tuple:
    """(clean tokens, corrupted tokens, key mask or None), both [prompt pos] on the model's device,
    with one padding (``attention_mask`` for token ids; text pads each list, which must agree)."""
    clean, clean_mask = model.input_to_tokens(clean_tokens, attention_mask, None, "right")
    corrupted, key_mask = model.input_to_tokens(corrupted_tokens, attention_mask, None, "right")
    if tuple(clean.shape) != tuple(corrupted.shape):
        raise ValueError(f"clean tokens have shape {tuple(clean.shape)}, corrupted {tuple(corrupted.shape)}: "
                         "attribution patching compares the two runs position by position (same prompts count "
                         "and length)")
    if (clean_mask is None) != (key_mask is None) or (key_mask is not None and not torch.equal(clean_mask, key_mask)):
        raise ValueError("the clean and corrupted prompts are padded differently; give token ids of one length "
                         "with one attention_mask")
    for what, tokens in (("clean tokens", clean), ("corrupted tokens", corrupted)):
        try:
            model.check_tokens(tokens)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
    return clean, corrupted, key_mask


def check_metric(model, metric, n_prompts: int, seq_len: int, reduce, device) -> None:
    if not callable(metric):
        raise TypeError(f"metric must be callable: fn(logits) -> one value per prompt, got {type(metric).__name__}")
    if reduce not in ("mean", None):
        raise ValueError(f"reduce must be 'mean' or None, got {reduce!r}")
    if reduce is None and isinstance(metric, VariantMetric):
        raise ValueError("reduce=None keeps one value per prompt, but a VariantMetric gives one value for all "
                         "prompts together; leave reduce='mean'")
    if isinstance(metric, PositionMetric):
        metric.positions(n_prompts, seq_len, device)
        metric.check_vocab(model.cfg.d_vocab)


@contextmanager
def flags_on(model, flags):
    """Turn the named HookFlags fields on for the block; restore each one's value afterwards."""
    saved = {flag: getattr(model.hook_flags, flag) for flag in flags if flag is not None}
    try:
        for flag in saved:
            setattr(model.hook_flags, flag, True)
        yield
    finally:
        for flag, value in reversed(list(saved.items())):
            if getattr(model.hook_flags, flag) != value:
                setattr(model.hook_flags, flag, value)


def check_names_exist(model, specs: list) -> None:
    for spec in specs:
        for name in spec.names:
            if name not in model.hook_dict:
                model.resolve_hook_names(name)  # raises the model's own message


def clean_activations(model, tokens: Tensor, key_mask: Optional[Tensor], names: list,
                      clean_cache: Optional[Mapping]) -> dict:
    """name -> clean activation: from ``clean_cache`` when given, else one no-grad clean forward."""
    if clean_cache is not None:
        if not isinstance(clean_cache, Mapping):
            raise TypeError(f"clean_cache must be a mapping hook name -> tensor, got {type(clean_cache).__name__}")
        missing = [name for name in names if name not in clean_cache]
        if missing:
            raise KeyError(f"clean cache has no {missing[0]!r}; cache it in the clean run (e.g. names_filter)")
        return {name: clean_cache[name] for name in names}
    acts: dict = {}
    keep = lambda act, hook: acts.__setitem__(hook.name, act.detach())
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, keep) for name in dict.fromkeys(names)]):
        model(tokens, attention_mask=key_mask, return_type=None)
    return acts


def keep_with_grad(store: dict):
    """A forward hook keeping the activation in the graph (a leaf that needs a gradient where the
    graph upstream has none)."""
    def keep(act: Tensor, hook):
        if not act.requires_grad:
            act = act.detach().requires_grad_(True)
        store[hook.name] = act
        return act

    return keep


def corrupted_forward(model, tokens: Tensor, key_mask: Optional[Tensor], metric, grad_names: list,
                      extra_hooks=()) -> tuple:
    """The corrupted forward under grad: (per-prompt metric values [prompt] or a VariantMetric's
    scalar, the objective whose gradient is taken, name -> activation in the graph).

    The objective is the sum over prompts: prompts do not interact, so its gradient at prompt b's
    activations is the gradient of prompt b's own metric. A PositionMetric gets logits at its read
    positions only (unless a hook sits on the final norm or the unembedding: then full logits)."""
    acts: dict = {}
    keep = keep_with_grad(acts)
    hooks = [(name, keep) for name in dict.fromkeys(grad_names)] + list(extra_hooks)
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        if isinstance(metric, PositionMetric) and not readout_hooked(model):
            # Only the read positions are unembedded (and differentiated through the unembedding).
            resid = model(tokens, attention_mask=key_mask, stop_at_layer=model.cfg.n_layers)
            rows = torch.arange(tokens.shape[0], device=tokens.device)
            read = resid[rows, metric.positions(tokens.shape[0], tokens.shape[1], tokens.device)][:, None]
            logits = devices.unembed(model, read)
            values = metric.read(logits[:, 0])
        else:
            logits = model(tokens, attention_mask=key_mask)
            values = metric(logits)
    name = metric_name(metric)
    where = "on the corrupted run"
    check_values(metric, values, where, need_grad=False)
    if isinstance(metric, VariantMetric):
        if values.numel() != 1:
            raise ValueError(f"the metric {name} returned shape {tuple(values.shape)}; a VariantMetric returns one "
                             "tensor value")
        values = values.reshape(())
        objective = values
    else:
        if values.shape != (tokens.shape[0],):
            raise ValueError(f"the metric {name} returned {tuple(values.shape)}; it must return one value per prompt "
                             f"[{tokens.shape[0]}] (or wrap a whole-batch metric in VariantMetric)")
        objective = values.sum()
    check_has_grad(metric, objective, where)
    check_reads_logits(metric, objective, logits, where)
    return values.detach(), objective, acts


def check_clean_values(model, specs: list, clean: dict, corrupted: dict, n_prompts: int, seq_len: int) -> None:
    for spec in specs:
        shape = expected_shape(model, spec, n_prompts, seq_len)
        for name in spec.names:
            value = clean[name]
            if not isinstance(value, Tensor):
                raise ValueError(f"clean {name} is a {type(value).__name__}, not a tensor")
            check_act(spec, name, corrupted[name], "the activation")
            want = tuple(corrupted[name].shape) if shape is None else shape
            if tuple(value.shape) != want:
                raise ValueError(f"clean {name} has shape {tuple(value.shape)}; the corrupted run's is {want} (same "
                                 "prompts count and length, with the batch axis)")
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise ValueError(f"clean {name} holds {int((~torch.isfinite(value)).sum())} values that are not "
                                 "finite (NaN or inf): every estimate from it would be NaN; check the clean cache or "
                                 "the model")


def check_corrupted_cache(corrupted_cache: Optional[Mapping], names: list, live: dict) -> None:
    """A given corrupted cache must hold this corrupted run's values (else the estimate would mix
    two runs): shapes equal, values within float rounding of the gradient run's."""
    if corrupted_cache is None:
        return
    if not isinstance(corrupted_cache, Mapping):
        raise TypeError(f"corrupted_cache must be a mapping hook name -> tensor, got {type(corrupted_cache).__name__}")
    for name in names:
        if name not in corrupted_cache:
            raise KeyError(f"corrupted cache has no {name!r}; cache it in the corrupted run (e.g. names_filter)")
        cached, value = corrupted_cache[name], live[name].detach()
        if not isinstance(cached, Tensor) or tuple(cached.shape) != tuple(value.shape):
            got = tuple(cached.shape) if isinstance(cached, Tensor) else type(cached).__name__
            raise ValueError(f"corrupted cache {name} has shape {got}; the corrupted run's is {tuple(value.shape)}")
        cached = cached.to(value.device, value.dtype)
        scale = float(value.abs().max()) if value.numel() else 0.0
        tol = (1e-3 if value.dtype in (torch.float16, torch.bfloat16) else 1e-5) * max(scale, 1.0)
        gap = float((cached - value).abs().max()) if value.numel() else 0.0
        if not gap <= tol:  # NaN in either compares False: refused too
            raise ValueError(f"corrupted cache {name} differs from this corrupted run by up to {gap:.3g} (values up "
                             f"to {scale:.3g}): it is not a cache of corrupted_tokens on this model")


class GradGate(torch.autograd.Function):
    """Identity forward; backward passes the gradient, or zeros when ``state["drop"] == layer``.
    The state is read when the backward runs, so one graph serves every GradDrop pass."""

    @staticmethod
    def forward(ctx, x, state, layer):
        ctx.state, ctx.layer = state, layer
        return x.clone()  # a fresh tensor: later in-place edits downstream cannot touch the input

    @staticmethod
    def backward(ctx, grad):
        if ctx.state.get("drop") == ctx.layer:
            return torch.zeros_like(grad), None, None
        return grad, None, None


def residual_writes(model, layer: int) -> list:
    """The hook points where block ``layer`` writes into the residual stream (attention, MLP)."""
    return [name for name in (f"blocks.{layer}.hook_attn_out", f"blocks.{layer}.hook_mlp_out")
            if name in model.hook_dict]


def gate_hooks(model, state: dict) -> list:
    hooks = []
    for layer in range(model.cfg.n_layers):
        gate = (lambda layer: lambda act, hook: GradGate.apply(act, state, layer))(layer)
        hooks += [(name, gate) for name in residual_writes(model, layer)]
    return hooks


def node_scores(spec: NodeSpec, clean: dict, corrupted: dict, grads: dict) -> Tensor:
    """[batch (layer) *node_axes]: per prompt, (clean - corrupted) . gradient summed over each node."""
    from .nodes import to_nodes

    out = []
    for name in spec.names:
        wide = torch.promote_types(corrupted[name].dtype, torch.float32)  # products summed in float32 or wider
        value = corrupted[name].detach().to(wide)
        grad = grads.get(name)
        grad = torch.zeros_like(value) if grad is None else grad.to(wide)  # None: the metric does not read it
        diff = clean[name].to(value.device, wide) - value
        out.append(to_nodes(spec, diff * grad))
    return torch.stack(out, 1) if spec.layered else out[0]
