"""HookPoint: an identity module where hook functions read or replace an activation.

Contract:
- A forward hook is ``fn(activation, hook) -> Tensor | None``. Returning ``None`` leaves the value
  as it is (read-only use); returning a tensor replaces it, and it must keep the shape, dtype and
  device (an error names the hook, what it returned and what was expected).
- A backward hook has the same signature and receives the gradient of the loss with respect to this
  hook point's output (after any forward hooks ran). It may return a replacement gradient. It belongs
  to the forwards that ran while it was attached, as torch's module backward hooks (and so
  TransformerLens's) do: the backward hooks attached when the forward passes a hook point are the
  ones that fire for that forward's gradients, in every backward through it (``retain_graph``), also
  after they were removed (a ``hooks()`` block that has exited); one attached after the forward does
  not fire for it.
- With no hook attached, ``forward`` returns its input untouched: an unhooked model pays one
  attribute check per hook point and nothing else.
- Each ``add_hook`` is one registration: ``fwd_hooks`` and ``bwd_hooks`` hold ``Registration``
  objects (the function is ``.fn``), and a ``HookHandle`` removes exactly its own registration, so
  the same function added twice is removed once per handle, from its own place in the order.
- A registration is permanent (``is_permanent``, ``add_perma_hook``) or not, and may carry a
  ``context_level`` (the ``hooks()`` block depth it belongs to, as in TransformerLens). Removing by
  kind (``remove_hooks``) follows TransformerLens: permanent hooks stay unless
  ``including_permanent=True`` (which removes every hook, whatever its level); otherwise a ``level``
  removes only the non-permanent hooks of that level.

Footgun: hooks are state on the model. Prefer ``model.hooks(...)`` or ``run_with_hooks``, which
remove exactly what they added, even when something raises.
"""

import re
from functools import partial
from typing import Callable, Optional

import torch.utils.hooks as torch_hooks
from torch import Tensor, nn

HookFn = Callable[..., Optional[Tensor]]
DIRECTIONS = ("fwd", "bwd", "both")
_LAYER = re.compile(r"[^.]+\.(\d+)(\.|$)")


class NoLayerError(ValueError, IndexError):
    """A hook point's name has no layer index. Both a ValueError and an IndexError, the two errors
    TransformerLens's ``HookPoint.layer()`` raises for such names."""


class Registration:
    """One attachment of ``fn`` at one hook point; identity tells two attachments of one fn apart.

    ``is_permanent`` and ``context_level`` have TransformerLens's meaning (its ``LensHandle``)."""

    __slots__ = ("fn", "is_permanent", "context_level", "hook")

    def __init__(self, fn: HookFn, is_permanent: bool = False, context_level: Optional[int] = None):
        self.fn = fn
        self.is_permanent = is_permanent
        self.context_level = context_level
        self.hook: Optional["HookHandle"] = None  # the handle that removes it (TransformerLens's LensHandle.hook)

    @property
    def user_hook(self) -> HookFn:
        """The function (TransformerLens's name for it)."""
        return self.fn

    def removable(self, including_permanent: bool, level: Optional[int]) -> bool:
        """Whether ``remove_hooks(including_permanent=..., level=...)`` removes this registration."""
        if including_permanent:
            return True
        return not self.is_permanent and (level is None or self.context_level == level)

    def __repr__(self) -> str:
        extra = ", permanent" if self.is_permanent else ""
        extra += f", level={self.context_level}" if self.context_level is not None else ""
        return f"Registration({getattr(self.fn, '__qualname__', self.fn)!r}{extra})"


def check_direction(dir, allowed=DIRECTIONS, where: str = "") -> None:
    if not isinstance(dir, str) or dir not in allowed:
        options = " or ".join(repr(d) for d in allowed)
        raise ValueError(f"hook direction must be {options}, got {dir!r}{where}")


def check_level(level) -> None:
    if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
        raise TypeError(f"level must be an int (a hooks() block depth) or None, got {level!r}")


class HookHandle:
    """Removes one registration from one HookPoint; removing twice is harmless. ``id`` is drawn from
    torch's hook-handle counter (``torch.utils.hooks.RemovableHandle.next_id``), as the torch handles
    TransformerLens keeps in ``LensHandle.hook`` are, so ids grow in the order hooks were added."""

    def __init__(self, point: "HookPoint", registration: Registration, dir: str):
        self.point, self.registration, self.dir = point, registration, dir
        counter = torch_hooks.RemovableHandle
        self.id = counter.next_id
        counter.next_id += 1

    @property
    def fn(self) -> HookFn:
        return self.registration.fn

    def remove(self) -> None:
        hooks = self.point.fwd_hooks if self.dir == "fwd" else self.point.bwd_hooks
        for i, registration in enumerate(hooks):
            if registration is self.registration:
                del hooks[i]
                return


def _torch_global_hooks() -> bool:
    """Whether torch has module hooks registered for every module (``nn.modules.module.register_module_*``)."""
    m = nn.modules.module
    return bool(getattr(m, "_global_forward_hooks", None) or getattr(m, "_global_forward_pre_hooks", None)
                or getattr(m, "_global_backward_hooks", None) or getattr(m, "_global_backward_pre_hooks", None))


class HookPresence:
    """``HookPoint.has_hooks``: a flag glassbox reads (true while any hook is attached) and the method
    TransformerLens 3.x calls: ``has_hooks(dir, including_permanent, level)`` is whether a hook of
    direction ``dir`` ("fwd", "bwd" or "both"), permanent ones only if ``including_permanent``, added at
    context ``level`` (None: any) is attached."""

    __slots__ = ("_point",)

    def __init__(self, point: "HookPoint"):
        self._point = point

    def __bool__(self) -> bool:
        return self._point._any_hooks()

    def __call__(self, dir: str = "both", including_permanent: bool = True, level: Optional[int] = None) -> bool:
        check_direction(dir, ("fwd", "bwd", "both"), f" (has_hooks at {self._point.name})")
        check_level(level)
        registrations = {"fwd": self._point.fwd_hooks, "bwd": self._point.bwd_hooks,
                         "both": self._point.fwd_hooks + self._point.bwd_hooks}[dir]
        return any((including_permanent or not r.is_permanent) and (level is None or r.context_level == level)
                   for r in registrations)

    def __eq__(self, other) -> bool:
        return bool(self) == other

    __hash__ = None

    def __repr__(self) -> str:
        return repr(bool(self))


class HookPoint(nn.Module):
    """Identity at a named point of the forward pass. ``name`` is set by the root model."""

    def __init__(self):
        super().__init__()
        self.name: Optional[str] = None
        self.fwd_hooks: list[Registration] = []
        self.bwd_hooks: list[Registration] = []
        # Free-form context for hook functions, e.g. {"step": 3} during generation.
        self.ctx: dict = {}

    @property
    def has_hooks(self) -> "HookPresence":
        """Truthy while anything would see this point's value (``if point.has_hooks``): glassbox hooks, or
        torch's own module hooks (``register_forward_hook`` on this point, or a global
        ``register_module_forward_hook``), so the fused paths that skip an unhooked point (attention's
        kernel, a norm's scale) never skip one. Called, TransformerLens 3.x's
        ``has_hooks(dir="both", including_permanent=True, level=None)`` -> bool over glassbox's hooks."""
        return HookPresence(self)

    def _any_hooks(self) -> bool:
        return bool(self.fwd_hooks or self.bwd_hooks or self._forward_hooks or self._forward_pre_hooks
                    or self._backward_hooks or self._backward_pre_hooks or _torch_global_hooks())

    def add_hook(self, hook: HookFn, dir: str = "fwd", is_permanent: bool = False,
                 level: Optional[int] = None, prepend: bool = False) -> HookHandle:
        """Attach ``hook`` (TransformerLens's argument order); ``prepend`` puts it before the others."""
        check_direction(dir, ("fwd", "bwd"), f" (at {self.name})")
        if not callable(hook):
            raise TypeError(f"hook at {self.name} must be callable, got {type(hook).__name__}")
        check_level(level)
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        registration = Registration(hook, bool(is_permanent), level)
        registration.hook = HookHandle(self, registration, dir)
        hooks.insert(0, registration) if prepend else hooks.append(registration)
        return registration.hook

    def add_perma_hook(self, hook: HookFn, dir: str = "fwd") -> HookHandle:
        """A hook that ``reset_hooks()`` leaves in place (until ``including_permanent=True``)."""
        return self.add_hook(hook, dir=dir, is_permanent=True)

    def remove_hooks(self, dir: str = "fwd", including_permanent: bool = False,
                     level: Optional[int] = None) -> None:
        """Remove hooks by kind, as TransformerLens does (``dir`` defaults to "fwd" there too):
        the non-permanent ones (of ``level`` only, when given), or with ``including_permanent`` all."""
        check_direction(dir)
        check_level(level)
        for side in ("fwd", "bwd"):
            if dir in (side, "both"):
                hooks = self.fwd_hooks if side == "fwd" else self.bwd_hooks
                # In place: whoever holds the list (a sweep restoring it) keeps the same object.
                hooks[:] = [r for r in hooks if not r.removable(including_permanent, level)]

    def clear_context(self) -> None:
        """Empty ``ctx`` (a new dict)."""
        self.ctx = {}

    def layer(self) -> int:
        """The layer index in a name ``blocks.{layer}...``; ``NoLayerError`` for other names."""
        if self.name is None:
            raise ValueError("this hook point has no name yet (the root model's setup() names it)")
        match = _LAYER.match(self.name)
        if match is None:
            raise NoLayerError(f"hook point {self.name!r} has no layer index: layer() reads the number "
                               "in a name 'blocks.<layer>....'")
        return int(match.group(1))

    def forward(self, x: Tensor) -> Tensor:
        if not self.fwd_hooks and not self.bwd_hooks:
            return x
        for registration in list(self.fwd_hooks):
            out = registration.fn(x, hook=self)
            if out is not None:
                self._check_replacement(x, out, "forward hook")
                x = out
        if self.bwd_hooks and x.requires_grad:
            x.register_hook(partial(self._run_bwd_hooks, tuple(self.bwd_hooks)))
        return x

    def _run_bwd_hooks(self, registrations: tuple, grad: Tensor) -> Tensor:
        for registration in registrations:
            out = registration.fn(grad, hook=self)
            if isinstance(out, tuple) and len(out) == 1:  # (grad,): torch's module-hook form, as TransformerLens
                out = out[0]
            if out is not None:
                self._check_replacement(grad, out, "backward hook")
                grad = out
        return grad

    def _check_replacement(self, old: Tensor, new, kind: str) -> None:
        if not isinstance(new, Tensor):
            raise TypeError(f"{kind} at {self.name} returned {type(new).__name__}; return a Tensor or None"
                            + (" (or a backward hook's (grad,))" if kind == "backward hook" else ""))
        if new.shape != old.shape or new.dtype != old.dtype:
            raise ValueError(
                f"{kind} at {self.name} returned shape {tuple(new.shape)} {new.dtype}, "
                f"expected shape {tuple(old.shape)} {old.dtype}"
            )
        if new.device != old.device:
            raise ValueError(f"{kind} at {self.name} returned a tensor on device {new.device}, expected "
                             f"device {old.device} (where the activation is); move it with .to(x.device)")

    def extra_repr(self) -> str:
        return f"name={self.name!r}, fwd={len(self.fwd_hooks)}, bwd={len(self.bwd_hooks)}"
