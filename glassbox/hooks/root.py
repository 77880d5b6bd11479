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
  blocks; a block's hooks carry its level, and so does ``add_hook(..., level=k)``. When block k
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


class HookedRootModule(nn.Module):
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
        """How many ``hooks()`` blocks are open (TransformerLens's context level); 0 outside any."""
        return len(self._hook_scopes)

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
        for name, point in self.hook_dict.items():
            if wanted(name):
                found = [r for side in ("fwd", "bwd") if dir in (side, "both")
                         for r in (point.fwd_hooks if side == "fwd" else point.bwd_hooks)
                         if including_permanent or not r.is_permanent]
                if found:
                    out[name] = found
        return out

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
        if not is_permanent and level is not None and 1 <= level <= len(self._hook_scopes):
            self._hook_scopes[level - 1].extend(handles)
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
            level = len(self._hook_scopes)
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
