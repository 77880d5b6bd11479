"""Splicing SAEs and transcoders into a model: ``add_sae``, ``reset_saes``, ``saes(...)``.

An SAE spliced at hook ``H`` replaces the value there by its reconstruction; a transcoder reads at
``hook_name`` and writes at ``hook_name_out``. The model methods of the same names call these.

What runs at the write hook, for the model's value ``x`` there (``sae_in`` is ``x`` for an SAE, the
value captured at the read hook for a transcoder):
- hooks at ``H`` fire on ``x`` (the model's own value), then ``acts = encode(sae_in)`` and
  ``recons = decode(acts)`` fire ``H.hook_sae_input``, ``.hook_sae_acts_pre``, ``.hook_sae_acts_post``,
  ``.hook_sae_recons`` (SAELens's names);
- without the error term the model carries on with ``recons`` (plus ``sae_in @ W_skip.T`` for a skip
  transcoder: the SAE's ``forward``; SAELens's HookedSAETransformer leaves the skip term out);
- with ``use_error_term=True`` it carries on with ``recons + error``, ``error = x - clean_recons``
  through ``H.hook_sae_error``, where ``clean_recons`` is the reconstruction with no hooks firing
  (recomputed only when a hook is attached to the SAE's points). When no hook replaces anything the
  value is ``x`` exactly, bit for bit: it is computed as ``x + (recons - clean_recons) + (error -
  error_0)``, each difference exactly zero then. The error term is differentiable, so the gradient
  reaching upstream is the clean model's too (SAELens computes the error under no_grad, so its
  upstream gradient is the reconstruction's only).
- ``H.hook_sae_output`` fires on what the model carries on with.

The SAE's parameters are not the model's; the SAE must be on the model's device (checked by add_sae,
and at run time, where a model moved since names it). ``add_sae`` also refuses an SAE whose d_in (d_out)
is not its hooks' width (``SAE.check_fits``, from HOOK_SHAPES; a hook the table does not know is checked
when the SAE first reads it), one put at a hook point of another spliced SAE, and one with a NaN or
inf in a parameter or buffer (``checks.py``: checked when spliced, not at every forward). Several SAEs may be
spliced at once, each at its own hook; adding one where another is spliced replaces it (as SAELens).
"""

import weakref
from contextlib import contextmanager
from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from ...hooks import HookPoint, Splice
from ...hooks.root import unknown_name_message
from .base import SAE
from .checks import check_finite_state, check_one_head


# The model each spliced SAE is in (its hook points carry that model's names while it is).
SPLICED_IN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Capture:
    """The transform at a transcoder's read hook: keeps the value for the write hook, passes it on."""

    def __init__(self, sae: SAE):
        self.sae = sae
        self.value: Optional[Tensor] = None
        self.handle = None  # the model's forward pre-hook that forgets the value at each forward's start

    def forget(self, *_) -> None:
        self.value = None

    def __call__(self, x: Tensor) -> Tensor:
        self.value = x
        return x


class SpliceRun:
    """The transform at the write hook (see the module docstring)."""

    def __init__(self, sae: SAE, use_error_term: bool, capture: Optional[Capture] = None):
        self.sae = sae
        self.use_error_term = bool(use_error_term)
        self.capture = capture

    def points(self) -> dict:
        return {name: getattr(self.sae, name) for name in self.sae.hook_dict}

    def output(self, sae_in: Tensor, x: Tensor) -> Tensor:
        """What the SAE writes, shaped and typed like ``x``: ``decode(encode(sae_in))``, plus a skip
        transcoder's ``sae_in @ W_skip.T`` (its ``forward``)."""
        sae = self.sae
        out = sae.decode(sae.encode(sae_in))
        extra = sae.skip(sae_in)
        if extra is not None:
            out = out + extra
        return out.reshape(x.shape).to(x.dtype)

    def __call__(self, x: Tensor) -> Tensor:
        sae = self.sae
        if sae.device != x.device:
            raise ValueError(f"the SAE spliced at {sae.cfg.hook_out} is on {sae.device}, the activation on "
                             f"{x.device} (the model moved after add_sae?); move it (sae.to({str(x.device)!r}))")
        sae_in = x
        if self.capture is not None:
            sae_in, self.capture.value = self.capture.value, None
            if sae_in is None or sae_in.shape[:2] != x.shape[:2]:
                raise RuntimeError(f"the transcoder writing at {sae.cfg.hook_out} reads at {sae.cfg.hook_name}, "
                                   "which did not run first in this forward (a run starting past it?)")
        hooked = [p for p in self.points().values() if (p.fwd_hooks or p.bwd_hooks)]
        if self.use_error_term and not hooked:
            return x  # recons + (x - recons), with nothing to see or change it: x itself, exactly
        recons = self.output(sae_in, x)
        if self.use_error_term:
            clean = recons
            if hooked:
                with hooks_off(hooked):
                    clean = self.output(sae_in, x)
            error_0 = x - clean
            error = sae.hook_sae_error(error_0)
            recons = x.detach() + (recons - clean.detach()) + (error - error_0.detach())
        return sae.hook_sae_output(recons)


@contextmanager
def hooks_off(points: Sequence[HookPoint]):
    """Run the body with these points' hooks detached, then put them back in their order."""
    saved = [(p, list(p.fwd_hooks), list(p.bwd_hooks)) for p in points]
    try:
        for p in points:
            p.fwd_hooks.clear()
            p.bwd_hooks.clear()
        yield
    finally:
        for p, fwd, bwd in saved:
            p.fwd_hooks[:] = fwd
            p.bwd_hooks[:] = bwd


# -- the model-level operations ------------------------------------------------------------------
def acts_to_saes(model) -> dict:
    """SAEs spliced in, by the hook where each writes (SAELens's ``acts_to_saes``)."""
    return {name: splice.owner for name, splice in model.splices.items() if isinstance(splice.transform, SpliceRun)}


def add_sae(model, sae: SAE, use_error_term: Optional[bool] = None) -> None:
    """Splice ``sae`` into ``model`` at ``sae.cfg.hook_name`` (a transcoder also at ``hook_name_out``);
    ``use_error_term=None`` is the SAE's own ``sae.use_error_term`` (False unless set), as SAELens."""
    if not isinstance(sae, SAE):
        raise TypeError(f"add_sae takes a glassbox SAE, got {type(sae).__name__}")
    if use_error_term is None:
        use_error_term = sae.use_error_term
    if not isinstance(use_error_term, bool):
        raise TypeError(f"use_error_term must be True or False, got {use_error_term!r}")
    cfg = sae.cfg
    check_finite_state(sae, f"the SAE at {cfg.hook_name}")
    check_one_head(sae, f"the SAE at {cfg.hook_name}")
    for name in dict.fromkeys((cfg.hook_name, cfg.hook_out)):
        if name not in model.hook_dict:
            raise KeyError(f"the SAE reads or writes at {name!r}, which this model does not have: "
                           + unknown_name_message(name, model.hook_dict))
    for name in (cfg.hook_name, cfg.hook_out):
        inside = [s for s in model.splices if name.startswith(s + ".")]
        if inside:  # the spliced module calls its own points, so a splice put in place of one would never run
            raise ValueError(f"{name!r} is a hook point of what is spliced at {inside[0]!r}; an SAE cannot be "
                             "spliced inside another (hook its activations there instead)")
    if getattr(model, "cfg", None) is not None:  # widths from HOOK_SHAPES where it knows the hook, else at run time
        sae.check_fits(model)
    model_device = next(model.parameters()).device
    if sae.device != model_device:
        raise ValueError(f"the SAE at {cfg.hook_name} is on {sae.device} and the model on {model_device}; "
                         f"move it first (sae.to({str(model_device)!r}))")
    if any(sae is other for other in acts_to_saes(model).values()):
        raise ValueError(f"this SAE is already spliced into the model at {cfg.hook_out}")
    elsewhere = SPLICED_IN.get(sae)
    if elsewhere is not None and elsewhere() is not None and elsewhere() is not model:
        raise ValueError(f"this SAE is spliced into another model (its hook points are named "
                         f"{sae.hook_sae_input.name!r}); remove it there first, or splice a copy (copy.deepcopy(sae))")
    if getattr(sae, "batch_dependent", False):
        raise ValueError(f"the {sae.architecture} SAE at {cfg.hook_name} selects features over the whole batch, so a "
                         "position's features would depend on the other prompts (and on how the patching engine "
                         "batches its variants); splice its inference form, sae.to_jumprelu(), as SAELens does")
    remove_sae(model, cfg.hook_out, missing_ok=True)
    if cfg.is_transcoder:
        remove_sae(model, cfg.hook_name, missing_ok=True)
    capture = Capture(sae) if cfg.is_transcoder else None
    run = SpliceRun(sae, use_error_term, capture)
    if capture is not None:
        model.add_splice(cfg.hook_name, Splice(model.hook_dict[cfg.hook_name], capture, {}, owner=sae))
    try:
        model.add_splice(cfg.hook_out, Splice(model.hook_dict[cfg.hook_out], run, run.points(), owner=sae))
    except BaseException:
        if capture is not None:
            model.remove_splice(cfg.hook_name)
        raise
    SPLICED_IN[sae] = weakref.ref(model)
    if capture is not None:
        # A forward that stopped (or raised) between the two hooks leaves a value the next one must not read.
        capture.handle = model.register_forward_pre_hook(capture.forget)


def remove_sae(model, hook_name: str, missing_ok: bool = False) -> Optional[tuple]:
    """Remove what is spliced at ``hook_name`` (either end of a transcoder removes both ends).

    Returns ``(sae, use_error_term)`` of what was removed, or None when nothing was spliced there."""
    splice = model.splices.get(hook_name)
    if splice is None or not isinstance(splice.transform, (SpliceRun, Capture)):
        if missing_ok:
            return None
        raise KeyError(f"no SAE is spliced at {hook_name!r}; spliced: {sorted(acts_to_saes(model)) or 'none'}")
    sae = splice.owner
    write = model.splices[sae.cfg.hook_out]
    use_error_term = write.transform.use_error_term
    capture = write.transform.capture
    model.remove_splice(sae.cfg.hook_out)
    if sae.cfg.is_transcoder and sae.cfg.hook_name in model.splices:
        model.remove_splice(sae.cfg.hook_name)
    if capture is not None:
        capture.forget()
        if capture.handle is not None:
            capture.handle.remove()
    SPLICED_IN.pop(sae, None)
    sae.setup()  # its hook points had the model's long names while spliced; give them back their own
    return sae, use_error_term


def reset_saes(model, act_names: Optional[Iterable[str]] = None) -> None:
    """Remove the SAEs at ``act_names`` (hook names where they write), or all of them."""
    names = list(acts_to_saes(model)) if act_names is None else [act_names] if isinstance(act_names, str) \
        else list(act_names)
    for name in names:
        remove_sae(model, name)


@contextmanager
def with_saes(model, saes: Sequence[SAE] = (), reset_saes_end: bool = True, use_error_term: Optional[bool] = None):
    """Splice ``saes`` for the body of a ``with`` block, then remove them and put back whatever was
    spliced at their hooks before, also when the body raises. ``use_error_term=None`` is each SAE's own
    ``sae.use_error_term`` (False unless set), as SAELens."""
    if isinstance(saes, SAE):
        saes = [saes]
    error_term = use_error_term
    added, replaced = [], []
    try:
        for sae in saes:
            previous = [remove_sae(model, name, missing_ok=True) for name in (sae.cfg.hook_out, sae.cfg.hook_name)]
            # One of this block's own SAEs replaced by a later one at its hook is not restored at exit.
            replaced.extend(p for p in previous if p is not None and not any(p[0] is a for a in added))
            add_sae(model, sae, use_error_term=error_term)
            added.append(sae)
        yield model
    except BaseException:
        reset_saes_end = True
        raise
    finally:
        if reset_saes_end:
            for sae in reversed(added):
                remove_sae(model, sae.cfg.hook_out, missing_ok=True)
            for sae, error_term_before in reversed(replaced):
                add_sae(model, sae, use_error_term=error_term_before)


def run_with_saes(model, *args, saes: Sequence[SAE] = (), reset_saes_end: bool = True,
                  use_error_term: Optional[bool] = None, **kwargs):
    """``model(*args, **kwargs)`` with ``saes`` spliced in (SAELens's ``run_with_saes``)."""
    with with_saes(model, saes, reset_saes_end, use_error_term):
        return model(*args, **kwargs)


def run_with_cache_with_saes(model, *args, saes: Sequence[SAE] = (), reset_saes_end: bool = True,
                             use_error_term: Optional[bool] = None, **kwargs):
    """``model.run_with_cache(*args, **kwargs)`` with ``saes`` spliced in; the cache holds the SAEs'
    hook points (``<hook>.hook_sae_acts_post`` ...)."""
    with with_saes(model, saes, reset_saes_end, use_error_term):
        return model.run_with_cache(*args, **kwargs)


def run_with_hooks_with_saes(model, *args, saes: Sequence[SAE] = (), reset_saes_end: bool = True,
                             use_error_term: Optional[bool] = None, fwd_hooks=(), bwd_hooks=(),
                             reset_hooks_end: bool = True, clear_contexts: bool = False, **kwargs):
    """``model.run_with_hooks(...)`` with ``saes`` spliced in."""
    with with_saes(model, saes, reset_saes_end, use_error_term):
        return model.run_with_hooks(*args, fwd_hooks=fwd_hooks, bwd_hooks=bwd_hooks,
                                    reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts, **kwargs)
