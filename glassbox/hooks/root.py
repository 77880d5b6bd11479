"""HookedRootModule: names every HookPoint in a model and manages hooks on them.

Contract:
- ``setup()`` (call at the end of ``__init__``) names each HookPoint by its dotted module path and
  fills ``hook_dict``.
- A hook target is a name (``"blocks.0.attn.hook_pattern"``), or a filter: a callable on the name.
  An unknown name raises ``KeyError`` listing the closest valid names.
- ``hooks(...)`` and ``run_with_hooks(...)`` remove exactly the hooks they added when they exit,
  also when the body or a hook raises; hooks added by ``add_hook`` stay until removed. Exactly
  means by registration, not by function: nested blocks that attach the same function leave the
  outer block's hooks in their order when the inner one exits.
- Threads: while a ``hooks(...)`` block (or ``run_with_hooks``, or ``generate``) is active, its
  thread owns the model's hook state; a forward or a hook change from another thread raises
  ``RuntimeError`` (see ``threads.py``). One model per thread, or serialised calls.
"""

import difflib
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Sequence, Union

from torch import nn

from .hook_point import HookFn, HookHandle, HookPoint
from .threads import HookStateGuard

NameOrFilter = Union[str, Callable[[str], bool]]
HookSpec = Sequence[tuple]


class HookedRootModule(nn.Module):
    hook_dict: dict
    hook_guard: HookStateGuard

    def setup(self) -> None:
        self.hook_guard = HookStateGuard()
        self.hook_dict = {}
        for name, module in self.named_modules():
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module

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
    def add_hook(self, name_or_filter: NameOrFilter, fn: HookFn, dir: str = "fwd",
                 prepend: bool = False) -> list:
        """Attach ``fn`` at every matched hook point; returns the handles that remove it."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"hook direction must be 'fwd' or 'bwd', got {dir!r}")
        names = self.resolve_hook_names(name_or_filter)
        self.hook_guard.check_change("add_hook")
        return [self.hook_dict[name].add_hook(fn, dir=dir, prepend=prepend) for name in names]

    def reset_hooks(self, dir: str = "both") -> None:
        """Remove every hook from every hook point."""
        self.hook_guard.check_change("reset_hooks")
        for point in self.hook_dict.values():
            point.remove_hooks(dir)

    @property
    def has_hooks(self) -> bool:
        return any(point.has_hooks for point in self.hook_dict.values())

    @contextmanager
    def hooks(self, fwd_hooks: HookSpec = (), bwd_hooks: HookSpec = ()) -> Iterator["HookedRootModule"]:
        """Attach hooks for the body of a ``with`` block, then remove exactly those."""
        handles: list[HookHandle] = []
        with self.hook_guard.claim("a hooks() block"):
            try:
                self._attach(fwd_hooks, bwd_hooks, handles)
                yield self
            finally:
                for handle in reversed(handles):
                    handle.remove()

    def run_with_hooks(self, *args, fwd_hooks: HookSpec = (), bwd_hooks: HookSpec = (),
                       reset_hooks_end: bool = True, **kwargs):
        """Run ``forward(*args, **kwargs)`` with hooks attached.

        Backward hooks need the backward pass to happen while they are attached: pass
        ``reset_hooks_end=False`` and call ``.backward()`` yourself, or use ``with model.hooks(...)``.
        With ``reset_hooks_end=False`` the hooks stay attached (remove them with ``reset_hooks``).
        """
        if reset_hooks_end:
            with self.hooks(fwd_hooks, bwd_hooks):
                return self(*args, **kwargs)
        handles: list[HookHandle] = []
        with self.hook_guard.claim("run_with_hooks"):
            try:
                self._attach(fwd_hooks, bwd_hooks, handles)
                return self(*args, **kwargs)
            except BaseException:
                # Kept hooks are the caller's only when the run succeeded.
                for handle in reversed(handles):
                    handle.remove()
                raise

    def _attach(self, fwd_hooks: HookSpec, bwd_hooks: HookSpec, handles: list) -> None:
        """Add every (name_or_filter, fn) pair, appending each handle to ``handles`` as it is made, so
        the caller can remove exactly what was added even when a later pair fails."""
        for specs, dir in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
            for name_or_filter, fn in _as_pairs(specs, dir):
                handles += self.add_hook(name_or_filter, fn, dir=dir)


def _as_pairs(specs: HookSpec, dir: str) -> Iterable[tuple]:
    for spec in specs:
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
            raise ValueError(f"each {dir} hook is a (name_or_filter, fn) pair, got {spec!r}")
        yield spec


def unknown_name_message(name: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    hint = f"closest valid names: {', '.join(close)}" if close else f"{len(valid)} valid names, e.g. {', '.join(valid[:3])}"
    return f"unknown hook name {name!r}; {hint}"
