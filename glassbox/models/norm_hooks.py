"""What LayerNorm and RMSNorm share: the fused kernel's bits unless a hook changed a value.

A norm's output comes from one fused kernel (``F.layer_norm`` / ``F.rms_norm``, weight and bias
included). Its two inner hook points hold values that kernel never makes: ``hook_scale`` [.. 1] and
``hook_normalized`` [.. d_model] (before w and b). When hooks are attached there, ``HookedNorm``
computes those values on the side and passes them through the hooks, then:

- if the hooks left every value as it was (returned None or the same tensor without editing it, or
  returned a tensor of equal values: a cache, a transcoder capturing its input, an SAE spliced there
  with its error term, a patch of the clean value into itself), the output is still the fused
  kernel's, bit for bit the unhooked run's. Under autograd its gradient flows through the values the
  hooks saw, by the explicit formula: a forward hook that keeps ``hook_normalized`` for
  ``torch.autograd.grad`` gets the downstream gradient, a backward hook there fires, and a scale
  frozen by ``scale.detach()`` stays frozen (these gradients equal the fused backward's to rounding);
- if a hook changed a value (in place, or by returning other values), the output is recomputed from
  what the hooks left: ``normalized = (x - mean) / scale`` (RMSNorm ``x / scale``) when the scale
  changed, else the kernel's normalised value; then ``normalized * w + b`` after ``hook_normalized``.

Footguns: a returned tensor other than the one given is compared with it (``torch.equal``, a device
sync on CUDA), and in inference mode, where tensors have no version counter, the value is compared
with a copy taken before the hooks ran (one extra [.. d_model] copy). A hook's value is read once: a
tensor the hook keeps and edits after the norm returned changes nothing.
"""

from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn


class Through(NamedTuple):
    value: Tensor  # what the hooks left
    same: bool  # the tensor given, not edited in place
    equal: bool  # values equal to the ones given (same implies equal)


def through_hook(point, value: Tensor) -> Through:
    """``value`` through hook point ``point``, and whether its hooks left it as it was."""
    tracked = not value.is_inference()
    before = value._version if tracked else value.clone()
    hooked = point(value)
    edited = value._version != before if tracked else not torch.equal(value, before)
    if edited:
        return Through(hooked, False, False)
    if hooked is value:
        return Through(hooked, True, True)
    return Through(hooked, False, torch.equal(hooked, value))


class FusedValue(torch.autograd.Function):
    """Forward: ``box[0]`` (a value computed outside autograd); backward: the gradient goes to
    ``explicit``, a differentiable computation of the same value up to rounding."""

    @staticmethod
    def forward(ctx, explicit: Tensor, box: list) -> Tensor:
        return box[0]

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def fused_value(kernel, explicit: Tensor, x: Tensor) -> Tensor:
    """``kernel(x)``'s bits, with ``explicit``'s gradient where autograd needs one."""
    if not explicit.requires_grad:
        return kernel(x)
    with torch.no_grad():
        value = kernel(x)
    return FusedValue.apply(explicit, [value])


class HookedNorm(nn.Module):
    """The forward of a norm with ``hook_scale``, ``hook_normalized`` and ``hook_out``. Subclasses give
    ``kernel(x)`` (the fused output), ``scale(x)``, ``kernel_normalized(x)`` (the fused kernel without
    w and b), ``from_scale(x, scale)`` (the normalised value from a given scale) and ``affine(normalized,
    x)`` (w and b applied, in x's dtype)."""

    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        scale_hooked, normalized_hooked = self.hook_scale.has_hooks, self.hook_normalized.has_hooks
        if not (scale_hooked or normalized_hooked):
            return self.hook_out(self.kernel(x))
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        scale = through_hook(self.hook_scale, self.scale(x)) if scale_hooked else None
        if scale is not None and not scale.equal:  # a changed scale: the formula from here on
            normalized = self.from_scale(x, scale.value)
            return self.hook_out(self.affine(self.hook_normalized(normalized) if normalized_hooked else normalized, x))
        if not (normalized_hooked or grad):
            return self.hook_out(self.kernel(x))
        if scale is None or not grad:
            normalized = self.kernel_normalized(x)
        else:  # the kernel's value; the gradient through the scale the hooks saw (kept, frozen or hooked)
            normalized = fused_value(self.kernel_normalized, self.from_scale(x, scale.value), x)
        if normalized_hooked:
            seen = through_hook(self.hook_normalized, normalized)
            if not seen.equal:
                return self.hook_out(self.affine(seen.value, x))
            normalized = seen.value
        if not grad:
            return self.hook_out(self.kernel(x))
        return self.hook_out(fused_value(self.kernel, self.affine(normalized, x), x))
