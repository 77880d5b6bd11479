"""RMSNorm (Llama's normalisation) with the same hook points as LayerNorm.

out = x / sqrt(mean(x^2) + eps) * w: no centering and no bias. ``hook_scale`` [.. 1] is the divisor
sqrt(mean(x^2) + eps); ``hook_normalized`` [.. d_model] is x / scale, before w (as in every
TransformerLens version); ``hook_out`` [.. d_model] the output normalized * w. As in LayerNorm, the
output is the fused kernel's unless a hook on ``hook_normalized`` or ``hook_scale`` changed the value
it saw (``norm_hooks.py``).

With ``cfg.norm_weight_offset`` (Gemma's 1.0) the norm multiplies by (offset + w), w kept as the
checkpoint stores it; the product is then computed in float32 for half-precision inputs, as in
transformers' Gemma (``hook_normalized`` holds the normalised value cast to the model's dtype).
``length`` (default d_model) sizes w for the q/k norms.

Footgun: RMSNorm does not remove the mean, so weight processing that relies on centering
(``center_writing_weights``) does not apply to models that use it.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_hooks import HookedNorm

HALF = (torch.float16, torch.bfloat16)


class RMSNorm(HookedNorm):
    def __init__(self, cfg: Config, length: Optional[int] = None):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.offset = float(cfg.norm_weight_offset)
        self.w = nn.Parameter(torch.ones(cfg.d_model if length is None else length))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def wide(self, x: Tensor) -> Tensor:
        """x in the dtype of the arithmetic: float32 for half-precision x under a weight offset."""
        return x.float() if self.offset and x.dtype in HALF else x

    def kernel(self, x: Tensor) -> Tensor:
        if not self.offset:
            return F.rms_norm(x, x.shape[-1:], self.w, self.eps)
        wide = self.wide(x)
        return (F.rms_norm(wide, x.shape[-1:], None, self.eps) * (self.offset + self.w.to(wide.dtype))).to(x.dtype)

    def scale(self, x: Tensor) -> Tensor:
        # in float32 for half-precision x: a mean square above 65504 (an RMS above 256) is inf in float16
        wide = torch.float32 if x.dtype in HALF else x.dtype
        mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=wide).square() / x.shape[-1]
        return (mean_square + self.eps).sqrt().to(x.dtype)

    def kernel_normalized(self, x: Tensor) -> Tensor:
        return F.rms_norm(self.wide(x), x.shape[-1:], None, self.eps).to(x.dtype)

    def from_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        wide = self.wide(x)
        return (wide / scale.to(wide.dtype)).to(x.dtype)

    def affine(self, normalized: Tensor, x: Tensor) -> Tensor:
        if not self.offset:
            return normalized * self.w
        wide = self.wide(normalized)
        return (wide * (self.offset + self.w.to(wide.dtype))).to(x.dtype)
