"""HookedRootModule: names every HookPoint in a model and manages hooks on them.

Contract:
- ``setup()`` (call at the end of ``__init__``) names each HookPoint by its dotted module path and
  fills ``hook_dict`` (hook points) and ``mod_dict`` (every named submodule), as TransformerLens does.
- A hook target is a name (``"blocks.0.attn.hook_pattern"``), or a filter: a callable on the name.
  An unknown name raises ``KeyError`` listing the closest valid names.
- ``hooks(...)`` and ``run_with_hooks(...)`` remove exactly the hooks they added when they exit,
  also when the body or a hook raises; hooks added by ``add_hook`` stay until removed. Exactly
  means by registration, not by function: nested blocks that attach the same function leave the
  outer block's hooks in their order when the inner one exits. With ``reset_hooks_end=False`` the
  block's hooks stay after a body that succeeds (and are removed when it raises: nothing is left
  half-attached by a failed run).
- Permanent hooks and levels, with TransformerLens's meaning: ``add_hook(..., is_permanent=True)``
  (or ``add_perma_hook``) survives ``reset_hooks()`` and every block's exit, until
  ``reset_hooks(including_permanent=True)``. ``context_level`` is the depth of open ``hooks()``
  blocks (plus the base a user set it to while none was open, as TransformerLens's tests do); a block's hooks carry its level, and so does ``add_hook(..., level=k)``. When block k
  exits it removes its own hooks and the non-permanent ones added with ``level=k`` while it was open
  (TransformerLens removes every non-permanent hook of level k; that also takes hooks kept at level k
  by an earlier ``reset_hooks_end=False`` block, which glassbox leaves). ``reset_hooks(level=k)``
  removes every non-permanent hook of level k.
- ``reset_hooks(clear_contexts=True, direction="both", including_permanent=False, level=None)`` is
  TransformerLens's signature: it empties every ``hook.ctx`` by default, and keeps permanent hooks.
  ``dir=`` (glassbox's earlier keyword) still names the direction.
- Threads: while a ``hooks(...)`` block (or ``run_with_hooks``, or ``generate``) is active, its
  thread owns the model's hook state; a forward or a hook change from another thread raises
  ``RuntimeError`` (see ``threads.py``). One model per thread, or serialised calls.
"""

import warnings
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

from torch import nn

from ..suggest import close_names
from .hook_point import HookFn, HookHandle, HookPoint, check_direction, check_level
from .splice import Splice, parent_and_attr
from .threads import HookStateGuard

NameOrFilter = Union[str, Callable[[str], bool]]
HookSpec = Sequence[tuple]


class HookIntrospectionMixin:
    """``list_hooks()`` for any class with a ``hook_dict`` {name: HookPoint} (an attribute or a property),
    as TransformerLens 3.x's mixin of that name; HookedRootModule has it."""

    def list_hooks(self, name_filter=None, dir: str = "both", including_permanent: bool = True) -> dict:
        """Attached registrations by hook name (points without any left out), as TransformerLens's
        ``list_hooks``: ``name_filter`` is None (all), a name, a list of names or a callable."""
        check_direction(dir)
        if name_filter is None:
            wanted = lambda name: True
        elif isinstance(name_filter, str):
            wanted = lambda name: name == name_filter
        elif callable(name_filter):
            wanted = name_filter
        else:
            names = set(name_filter)
            wanted = lambda name: name in names
        out = {}
        for name, point in getattr(self, "hook_dict").items():
            if wanted(name):
                found = [r for side in ("fwd", "bwd") if dir in (side, "both")
                         for r in (point.fwd_hooks if side == "fwd" else point.bwd_hooks)
                         if including_permanent or not r.is_permanent]
                if found:
                    out[name] = found
        return out


class HookedRootModule(HookIntrospectionMixin, nn.Module):
    hook_dict: dict
    mod_dict: dict
    hook_guard: HookStateGuard

    def setup(self) -> None:
        """Name the hook points. Calling it again (after swapping a submodule, as SAELens does) renames
        them and keeps the thread guard and any open ``hooks()`` blocks."""
        if "hook_guard" not in self.__dict__:
            self.hook_guard = HookStateGuard()
        if "_hook_scopes" not in self.__dict__:
            # One list of handles per open hooks() block, outermost first: len() is the context level.
            self._hook_scopes = []
        self.hook_dict = {}
        self.mod_dict = {}
        for name, module in self.named_modules():
            if name:
                self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

    def __setstate__(self, state: dict) -> None:
        """A copy (``copy.deepcopy``, unpickling) opens no ``hooks()`` block: the original's open blocks
        stay the original's, and hooks attached at the time of the copy are the copy's, as if added by
        ``add_hook`` (``reset_hooks`` removes them)."""
        super().__setstate__(state)
        self._hook_scopes = []

    @property
    def context_level(self) -> int:
        """How many ``hooks()`` blocks are open (TransformerLens's context level); 0 outside any,
        unless set: ``model.context_level = k`` (only while no block is open) makes the levels start
        from k, so the next block's hooks carry level k + 1."""
        return self.__dict__.get("_level_base", 0) + len(self.__dict__.get("_hook_scopes", ()))

    @context_level.setter
    def context_level(self, value) -> None:  # checked here (not annotated): a bad value is a ValueError
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"context_level must be an int >= 0, got {value!r}")
        open_blocks = len(self.__dict__.get("_hook_scopes", ()))
        if open_blocks:
            raise ValueError(f"context_level cannot be set while {open_blocks} hooks() block(s) are open: "
                             "their hooks carry the levels they were opened at")
        self.__dict__.setdefault("_hook_scopes", [])
        self.__dict__["_level_base"] = value

    def hook_points(self):
        """Every HookPoint, in forward order."""
        return self.hook_dict.values()

    # -- resolving targets -------------------------------------------------------------------
    def resolve_hook_names(self, name_or_filter: NameOrFilter) -> list:
        """Hook names matched by a name or a filter, in forward order."""
        if isinstance(name_or_filter, str):
            if name_or_filter not in self.hook_dict:
                raise KeyError(unknown_name_message(name_or_filter, self.hook_dict))
            return [name_or_filter]
        if callable(name_or_filter):
            return [name for name in self.hook_dict if name_or_filter(name)]
        raise TypeError(
            f"a hook target is a hook name or a callable filter on names, got {type(name_or_filter).__name__}"
        )


    # -- adding and removing -----------------------------------------------------------------
    def add_hook(self, name: NameOrFilter, hook: HookFn, dir: str = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> list:
        """Attach ``hook`` at every matched hook point; returns the handles that remove it.

        TransformerLens's signature. ``is_permanent``: ``reset_hooks()`` keeps it. ``level``: the
        context level it belongs to (the block of that level, when open, removes it at its exit).
        """
        check_direction(dir, ("fwd", "bwd"))
        check_level(level)
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        names = self.resolve_hook_names(name)
        self.hook_guard.check_change("add_hook")
        handles = [self.hook_dict[n].add_hook(hook, dir=dir, is_permanent=is_permanent, level=level,
                                              prepend=prepend) for n in names]
        scope = None if level is None else level - self.__dict__.get("_level_base", 0)
        if not is_permanent and scope is not None and 1 <= scope <= len(self._hook_scopes):
            self._hook_scopes[scope - 1].extend(handles)
        return handles

    def add_perma_hook(self, name: NameOrFilter, hook: HookFn, dir: str = "fwd") -> list:
        """A hook that survives ``reset_hooks()`` and every block's exit (TransformerLens's name)."""
        return self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_all_hook_fns(self, direction: str = "both", including_permanent: bool = False,
                            level: Optional[int] = None) -> None:
        """Remove the non-permanent hooks (of ``level`` only, when given), or all with
        ``including_permanent``, from every hook point."""
        check_direction(direction)
        check_level(level)
        self.hook_guard.check_change("remove_all_hook_fns")
        for point in self.hook_dict.values():
            point.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        """Empty every hook point's ``ctx``."""
        self.hook_guard.check_change("clear_contexts")
        for point in self.hook_dict.values():
            point.clear_context()

    # clear_contexts is left unannotated so that a direction passed first (glassbox's earlier
    # reset_hooks("fwd")) meets the error below, which says what to write instead.
    def reset_hooks(self, clear_contexts=True, direction: str = "both", including_permanent: bool = False,
                    level: Optional[int] = None, *, dir: Optional[str] = None) -> None:
        """Remove hooks (TransformerLens's signature and defaults): every non-permanent hook (of
        ``level`` only, when given), or every hook with ``including_permanent``; and, unless
        ``clear_contexts=False``, empty every ``hook.ctx``. ``dir=`` is an alias of ``direction``."""
        if not isinstance(clear_contexts, bool):
            raise TypeError(f"reset_hooks's first argument is clear_contexts (True or False), got "
                            f"{clear_contexts!r}; give the direction as direction={clear_contexts!r}")
        if dir is not None:
            if direction != "both" and direction != dir:
                raise ValueError(f"reset_hooks got direction={direction!r} and dir={dir!r}; give one")
            direction = dir
        check_direction(direction)
        check_level(level)
        self.hook_guard.check_change("reset_hooks")
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level)

    # -- splices (see splice.py) -----------------------------------------------------------------
    def add_splice(self, name: str, splice: Splice) -> None:
        """Put ``splice`` in place of the plain hook point ``name`` (its hooks stay, shared), renaming."""
        if not isinstance(splice, Splice):
            raise TypeError(f"add_splice takes a Splice, got {type(splice).__name__}")
        point = self.hook_dict.get(name)
        if point is None:
            raise KeyError(unknown_name_message(name, self.hook_dict))
        if isinstance(point, Splice):
            raise ValueError(f"hook point {name!r} already has something spliced in ({point.extra_repr()}); "
                             "remove it first")
        if splice.point is not point:
            raise ValueError(f"this splice was made for another hook point than {name!r}")
        self.hook_guard.check_change("add_splice")
        parent, attr = parent_and_attr(self, name)
        setattr(parent, attr, splice)
        self.setup()

    def remove_splice(self, name: str) -> HookPoint:
        """Put back the hook point that the splice at ``name`` stands for; returns it."""
        splice = self.hook_dict.get(name)
        if not isinstance(splice, Splice):
            raise KeyError(f"nothing is spliced at hook point {name!r}")
        self.hook_guard.check_change("remove_splice")
        parent, attr = parent_and_attr(self, name)
        setattr(parent, attr, splice.point)
        self.setup()
        return splice.point

    @property
    def splices(self) -> dict:
        """The splices in place, by hook name, in forward order."""
        return {name: point for name, point in self.hook_dict.items() if isinstance(point, Splice)}

    @property
    def has_hooks(self) -> bool:
        return any(point.has_hooks for point in self.hook_dict.values())

    @contextmanager
    def hooks(self, fwd_hooks: HookSpec = (), bwd_hooks: HookSpec = (), reset_hooks_end: bool = True,
              clear_contexts: bool = False) -> Iterator["HookedRootModule"]:
        """Attach hooks for the body of a ``with`` block, then remove exactly those.

        ``reset_hooks_end=False`` keeps them after a body that succeeds. ``clear_contexts=True``
        also empties every ``hook.ctx`` when the hooks are removed (TransformerLens's meaning).
        """
        for flag, value in (("reset_hooks_end", reset_hooks_end), ("clear_contexts", clear_contexts)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, got {value!r}")
        handles: list[HookHandle] = []
        with self.hook_guard.claim("a hooks() block"):
            self._hook_scopes.append(handles)
            level = self.context_level
            succeeded = False
            try:
                self._attach(fwd_hooks, bwd_hooks, level)
                yield self
                succeeded = True
            finally:
                self._hook_scopes.pop()
                if reset_hooks_end or not succeeded:
                    for handle in reversed(handles):
                        handle.remove()
                    if reset_hooks_end and clear_contexts:
                        for point in self.hook_dict.values():
                            point.clear_context()

    def run_with_hooks(self, *args, fwd_hooks: HookSpec = (), bwd_hooks: HookSpec = (),
                       reset_hooks_end: bool = True, clear_contexts: bool = False, **kwargs):
        """Run ``forward(*args, **kwargs)`` with hooks attached (TransformerLens's signature).

        Backward hooks belong to the forward they were attached for (see ``HookPoint``): they fire in a
        backward of this run's output made after it returns, though the hooks are removed by then
        (TransformerLens warns that they cannot; with torch's module hooks underneath, they do). With
        ``reset_hooks_end=False`` the hooks stay attached after a run that succeeds (remove them with
        ``reset_hooks``); a run that raises removes them.
        """
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*args, **kwargs)

    def run_with_cache(self, *model_args, names_filter=None, device=None, remove_batch_dim: bool = False,
                       incl_bwd: bool = False, reset_hooks_end: bool = True, clear_contexts: bool = False,
                       pos_slice=None, **model_kwargs) -> tuple:
        """``(self(*model_args, **model_kwargs), {hook name: activation})`` for any hooked module (a
        user's own HookedRootModule subclass; HookedTransformer has its own, returning an
        ActivationCache). TransformerLens's signature and plain-dict result.

        ``names_filter``: None (every hook point), a name, a list of names or a callable (an unknown
        name is a KeyError). ``incl_bwd``: also ``<name>_grad``, the gradient of the (scalar) output,
        computed with ``torch.autograd.grad``, so parameters' ``.grad`` stay as they were
        (TransformerLens's ``backward()`` accumulates into them). ``pos_slice`` is refused (a generic
        module's activations have no known position axis) and so is ``reset_hooks_end=False``.
        """
        import torch

        if pos_slice is not None:
            raise ValueError("pos_slice needs activations with a known position axis: HookedTransformer's "
                             "run_with_cache takes it, a generic HookedRootModule's does not")
        if not reset_hooks_end:
            raise ValueError("run_with_cache(reset_hooks_end=False) is not supported: the caching hooks are "
                             "always removed; add your own with add_hook")
        if names_filter is None:
            names = list(self.hook_dict)
        elif isinstance(names_filter, str) or callable(names_filter):
            names = self.resolve_hook_names(names_filter)
        else:
            names = [n for name in names_filter for n in self.resolve_hook_names(name)]
        store: dict = {}

        def save(key: str):
            def hook(act, hook):
                value = act.detach().clone()
                value = value.to(device) if device is not None else value
                store[key] = value[0] if remove_batch_dim else value
            return hook

        fwd = [(name, save(name)) for name in names]
        bwd = [(name, save(name + "_grad")) for name in names] if incl_bwd else []
        with self.hooks(fwd, bwd, clear_contexts=clear_contexts):
            if not incl_bwd:
                return self(*model_args, **model_kwargs), store
            params = [p for p in self.parameters() if p.requires_grad]
            with torch.enable_grad():
                out = self(*model_args, **model_kwargs)
                if not isinstance(out, torch.Tensor) or out.numel() != 1:
                    raise ValueError("incl_bwd differentiates the output, which must be a one-element tensor; got "
                                     f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
                if not params or not out.requires_grad:
                    raise ValueError("incl_bwd needs gradients, but the output does not depend on any parameter "
                                     "that requires grad")
                torch.autograd.grad(out, params, allow_unused=True)
            return out, store

    # -- TransformerLens's private helpers (its tests and subclasses call them) ------------------
    def _enable_hook_with_name(self, name: str, hook: HookFn, dir: str) -> None:
        """``mod_dict[name].add_hook(hook, dir=dir, level=context_level)``."""
        if name not in self.mod_dict:
            raise KeyError(unknown_name_message(name, self.mod_dict))
        self.mod_dict[name].add_hook(hook, dir=dir, level=self.context_level)

    def _enable_hooks_for_points(self, hook_points, enabled: Callable[[str], bool], hook: HookFn, dir: str) -> None:
        """``add_hook`` at the current context level on each (name, point) of ``hook_points`` whose
        name ``enabled`` accepts."""
        for name, point in hook_points:
            if enabled(name):
                point.add_hook(hook, dir=dir, level=self.context_level)

    def _enable_hook(self, name: NameOrFilter, hook: HookFn, dir: str) -> None:
        """A name (``_enable_hook_with_name``) or a filter on ``hook_dict``'s names."""
        if isinstance(name, str):
            self._enable_hook_with_name(name, hook, dir)
        elif callable(name):
            self._enable_hooks_for_points(self.hook_dict.items(), name, hook, dir)
        else:
            raise TypeError(f"a hook target is a hook name or a callable filter on names, got {type(name).__name__}")

    def _attach(self, fwd_hooks: HookSpec, bwd_hooks: HookSpec, level: int) -> None:
        """Add every (name_or_filter, fn) pair at ``level``; each handle joins the open block's list
        as it is made, so the block removes exactly what was added even when a later pair fails."""
        for specs, dir in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
            for name_or_filter, fn in _as_pairs(specs, dir):
                self.add_hook(name_or_filter, fn, dir=dir, level=level)


def _as_pairs(specs: HookSpec, dir: str) -> Iterable[tuple]:
    for spec in specs:
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
            raise ValueError(f"each {dir} hook is a (name_or_filter, fn) pair, got {spec!r}")
        yield spec


def unknown_name_message(name: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    close = close_names(name, valid, cutoff=0.5)
    hint = f"closest valid names: {', '.join(close)}" if close else f"{len(valid)} valid names, e.g. {', '.join(valid[:3])}"
    return f"unknown hook name {name!r}; {hint}"
