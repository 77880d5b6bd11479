"""HookPoint: an identity module where hook functions read or replace an activation.

Contract:
- A forward hook is ``fn(activation, hook) -> Tensor | None``. Returning ``None`` leaves the value
  as it is (read-only use); returning a tensor replaces it, and it must keep the shape, dtype and
  device (an error names the hook, what it returned and what was expected).
- A backward hook has the same signature and receives the gradient of the loss with respect to this
  hook point's output (after any forward hooks ran). It may return a replacement gradient.
- With no hook attached, ``forward`` returns its input untouched: an unhooked model pays one
  attribute check per hook point and nothing else.
- Each ``add_hook`` is one registration: ``fwd_hooks`` and ``bwd_hooks`` hold ``Registration``
  objects (the function is ``.fn``), and a ``HookHandle`` removes exactly its own registration, so
  the same function added twice is removed once per handle, from its own place in the order.

Footgun: hooks are state on the model. Prefer ``model.hooks(...)`` or ``run_with_hooks``, which
remove exactly what they added, even when something raises.
"""

from typing import Callable, Optional

from torch import Tensor, nn

HookFn = Callable[..., Optional[Tensor]]


class Registration:
    """One attachment of ``fn`` at one hook point; identity tells two attachments of one fn apart."""

    __slots__ = ("fn",)

    def __init__(self, fn: HookFn):
        self.fn = fn

    def __repr__(self) -> str:
        return f"Registration({getattr(self.fn, '__qualname__', self.fn)!r})"


class HookHandle:
    """Removes one registration from one HookPoint; removing twice is harmless."""

    def __init__(self, point: "HookPoint", registration: Registration, dir: str):
        self.point, self.registration, self.dir = point, registration, dir

    @property
    def fn(self) -> HookFn:
        return self.registration.fn

    def remove(self) -> None:
        hooks = self.point.fwd_hooks if self.dir == "fwd" else self.point.bwd_hooks
        for i, registration in enumerate(hooks):
            if registration is self.registration:
                del hooks[i]
                return


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
    def has_hooks(self) -> bool:
        return bool(self.fwd_hooks) or bool(self.bwd_hooks)

    def add_hook(self, fn: HookFn, dir: str = "fwd", prepend: bool = False) -> HookHandle:
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"hook direction must be 'fwd' or 'bwd', got {dir!r} (at {self.name})")
        if not callable(fn):
            raise TypeError(f"hook at {self.name} must be callable, got {type(fn).__name__}")
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        registration = Registration(fn)
        hooks.insert(0, registration) if prepend else hooks.append(registration)
        return HookHandle(self, registration, dir)

    def remove_hooks(self, dir: str = "both") -> None:
        if dir in ("fwd", "both"):
            self.fwd_hooks.clear()
        if dir in ("bwd", "both"):
            self.bwd_hooks.clear()

    def forward(self, x: Tensor) -> Tensor:
        if not self.fwd_hooks and not self.bwd_hooks:
            return x
        for registration in list(self.fwd_hooks):
            out = registration.fn(x, hook=self)
            if out is not None:
                self._check_replacement(x, out, "forward hook")
                x = out
        if self.bwd_hooks and x.requires_grad:
            x.register_hook(self._run_bwd_hooks)
        return x

    def _run_bwd_hooks(self, grad: Tensor) -> Tensor:
        for registration in list(self.bwd_hooks):
            out = registration.fn(grad, hook=self)
            if out is not None:
                self._check_replacement(grad, out, "backward hook")
                grad = out
        return grad

    def _check_replacement(self, old: Tensor, new, kind: str) -> None:
        if not isinstance(new, Tensor):
            raise TypeError(f"{kind} at {self.name} returned {type(new).__name__}; return a Tensor or None")
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
