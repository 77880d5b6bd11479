"""The user's hooks under a sweep: every sweep equals a one-patch-per-forward loop under the same hooks.

Contract: forward hooks already attached to the model when a sweep starts, and those passed to the
sweep as ``fwd_hooks=`` (attached for the whole sweep, then removed), act as they would in the loop

    with model.hooks(fwd_hooks=user_hooks):
        for variant in grid:
            metric(model.run_with_hooks(corrupted, fwd_hooks=[patch(variant)]))

To make that so, for the duration of the sweep:
- each user hook is called once per variant, on exactly the batch the loop's forward gives it:
  the engine's rows ``v * n_prompts + b`` are split into groups of ``n_prompts`` (one group, one
  variant) and the hook is called on each group, with the same ``hook`` (``hook.name``,
  ``hook.ctx``); a group it returns None for keeps its value. So a hook that reads positions, batch
  statistics (a mean over prompts) or ``hook.ctx`` sees what it would see in the loop, whatever
  ``memory_budget`` is. It is also called on the base corrupted run (the loop's layers before the
  patch);
- the position cut (``reuse_prefix``/``bands``) is off, so hooks see every position at its index;
- at a hook point the user's hooks run first, in their order, then the patch (as in the loop above);
- a readout whose final-norm or unembedding hook points carry user hooks uses full logits through
  ``ln_final`` and ``unembed``, not the one-position shortcut;
- the model's hook lists are put back exactly as they were (the same list objects, the same
  entries in the same order) however the sweep ends, KeyboardInterrupt included.

Footguns: a hook must be a function of (activation, hook, hook.ctx). It is called once per variant
and pass, not once per forward of the loop, so a hook that counts its calls, keeps state between
them, or caches what it sees (keeps only the last group) is not honoured, and this cannot be
detected. A hook returning another shape or dtype than its group is refused with an error naming it.
Hooks must not add or remove hooks while a sweep runs. Backward hooks never fire: the sweep runs
under ``torch.no_grad``, as a loop under ``no_grad`` would, and they cannot change forward values.
"""

from contextlib import contextmanager
from typing import Callable, Sequence

import torch
from torch import Tensor


def hook_label(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def per_variant(fn: Callable, n_prompts: int) -> Callable:
    """``fn`` called once per group of ``n_prompts`` rows of the batch axis, the results concatenated."""

    def run_per_variant(act: Tensor, hook) -> object:
        if act.shape[0] % n_prompts:
            raise RuntimeError(f"patching engine: {act.shape[0]} rows at {hook.name} are not whole copies "
                               f"of the {n_prompts} prompts")
        parts, changed = [], False
        for lo in range(0, act.shape[0], n_prompts):
            part = act[lo: lo + n_prompts]
            out = fn(part, hook=hook)
            if out is not None:
                if not (isinstance(out, Tensor) and out.shape == part.shape and out.dtype == part.dtype
                        and out.device == part.device):
                    got = (f"shape {tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, Tensor)
                           else type(out).__name__)
                    raise ValueError(f"user hook {hook_label(fn)} at {hook.name} returned {got} for a batch of "
                                     f"shape {tuple(part.shape)} {part.dtype} on {part.device}; under a patching "
                                     "sweep a hook must return None or a tensor of its input's shape, dtype "
                                     "and device")
                changed = True
            parts.append(part if out is None else out)
        return torch.cat(parts) if changed else None

    run_per_variant.__wrapped__ = fn
    return run_per_variant


@contextmanager
def user_hooks(model, fwd_hooks: Sequence, n_prompts: int):
    """Attach ``fwd_hooks``, run every user forward hook per variant for the body, then restore.

    Yields True when any forward hook is attached (the sweep must then honour them), else False.
    """
    saved: dict = {}
    with model.hooks(fwd_hooks=fwd_hooks):
        try:
            for point in model.hook_dict.values():
                if point.fwd_hooks:
                    original = saved[point] = point.fwd_hooks
                    point.fwd_hooks = []
                    for registration in original:  # each a Registration; its function is .fn
                        point.add_hook(per_variant(registration.fn, n_prompts))
            yield bool(saved)
        finally:
            for point, original in saved.items():
                point.fwd_hooks = original


def readout_hooked(model) -> bool:
    """Whether a forward hook sits at a hook point of the final norm or the unembedding."""
    return any(getattr(m, "fwd_hooks", None) for part in (model.ln_final, model.unembed) for m in part.modules())
