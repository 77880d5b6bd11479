"""Splice: a module spliced in at a hook point, in place of the HookPoint, keeping its name and hooks.

A splice (an SAE, a transcoder's read or write end) replaces the value flowing through one hook
point by what its module computes. ``HookedRootModule.add_splice(name, splice)`` puts a ``Splice``
where the HookPoint ``name`` was; ``remove_splice(name)`` puts the HookPoint back.

Contract:
- A ``Splice`` is a HookPoint with the same name: hooks at ``name`` fire first, on the model's own
  value (what the model computed there, before the spliced module), and then ``transform(x)``
  gives the value the model carries on. Registrations are shared with the HookPoint it stands for
  (the same lists), so handles taken before or during the splice remove what they added, and the
  hooks attached at ``name`` are still there once the splice is removed.
- The hook points of the spliced module become the model's, named ``name + "." + theirs``
  (``blocks.0.hook_resid_pre.hook_sae_acts_post``): visible to ``run_with_cache``,
  ``run_with_hooks``, patching and generation. The module itself is not a submodule of the model:
  its parameters are not the model's (``model.parameters()``, ``state_dict()`` and
  ``save_pretrained`` are unchanged, and ``model.to(...)`` does not move it).
- ``has_hooks`` is always True, so the fused fast paths that skip an unhooked point never skip a splice.
  A norm then computes its hook_scale / hook_normalized value on the side and keeps its fused output
  when the splice returns that value unchanged (a transcoder's read end, an SAE with its error term);
  attention, hooked at hook_attn_scores or hook_pattern, leaves its fused kernel.
"""

from typing import Callable

from torch import Tensor, nn

from .hook_point import HookPoint


class Splice(HookPoint):
    """Stands at a hook point: runs the point's hooks, then ``transform``.

    ``transform`` is a callable ``x -> Tensor`` of the same shape, dtype and device; ``points`` are the
    hook points it fires, given as ``{suffix: HookPoint}`` (they become children of the splice).
    ``owner`` is what was spliced in (an SAE), kept for ``model.splices``.
    """

    def __init__(self, point: HookPoint, transform: Callable[[Tensor], Tensor], points: dict, owner=None):
        super().__init__()
        if not isinstance(point, HookPoint) or isinstance(point, Splice):
            raise TypeError(f"a splice stands for a plain HookPoint, got {type(point).__name__}")
        # Not submodules: the point stays out of named_modules (the splice carries its name), the
        # transform's parameters stay out of the model's.
        self.__dict__["point"] = point
        self.__dict__["transform"] = transform
        self.__dict__["owner"] = owner
        self.fwd_hooks = point.fwd_hooks
        self.bwd_hooks = point.bwd_hooks
        self.ctx = point.ctx
        for suffix, hook in points.items():
            if not isinstance(hook, HookPoint):
                raise TypeError(f"splice point {suffix!r} is a {type(hook).__name__}, not a HookPoint")
            self.add_module(suffix, hook)

    @property
    def has_hooks(self) -> bool:
        return True

    def clear_context(self) -> None:
        self.point.ctx.clear()
        self.ctx = self.point.ctx

    def forward(self, x: Tensor) -> Tensor:
        out = self.transform(super().forward(x))
        if out.shape != x.shape or out.device != x.device or out.dtype != x.dtype:
            raise ValueError(f"the module spliced at {self.name} returned shape {tuple(out.shape)} {out.dtype} on "
                             f"{out.device}, expected {tuple(x.shape)} {x.dtype} on {x.device}")
        return out

    def extra_repr(self) -> str:
        return f"name={self.name!r}, spliced={type(self.owner).__name__ if self.owner is not None else '?'}"


def parent_and_attr(root: nn.Module, name: str) -> tuple:
    """The module holding hook point ``name`` and its attribute name there."""
    *path, attr = name.split(".")
    parent = root
    for part in path:
        parent = parent[int(part)] if isinstance(parent, (nn.ModuleList, nn.Sequential)) else getattr(parent, part)
    return parent, attr
