"""RMSNorm (Llama's normalisation) with the same hook points as LayerNorm.

out = x / sqrt(mean(x^2) + eps) * w: no centering and no bias. ``hook_scale`` [.. 1] is the divisor
sqrt(mean(x^2) + eps); ``hook_normalized`` [.. d_model] is x / scale, before w (as in every
TransformerLens version); ``hook_out`` [.. d_model] the output normalized * w. As in LayerNorm, the
fused kernel computes the output unless a hook is on ``hook_normalized`` or a hook on ``hook_scale``
replaced or edited the scale.

With ``cfg.norm_weight_offset`` (Gemma's 1.0) the norm multiplies by (offset + w), w kept as the
checkpoint stores it; the product is then computed in float32 for half-precision inputs, as in
transformers' Gemma. ``length`` (default d_model) sizes w for the q/k norms.

Footgun: RMSNorm does not remove the mean, so weight processing that relies on centering
(``center_writing_weights``) does not apply to models that use it.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_scale import hooked_scale


class RMSNorm(nn.Module):
    def __init__(self, cfg: Config, length: Optional[int] = None):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.offset = float(cfg.norm_weight_offset)
        self.w = nn.Parameter(torch.ones(cfg.d_model if length is None else length))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        hooked = None
        if self.hook_scale.has_hooks:
            # in float32 for half-precision x: a mean square above 65504 (an RMS above 256) is inf in float16
            wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
            mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=wide).square() / x.shape[-1]
            hooked = hooked_scale(self.hook_scale, (mean_square + self.eps).sqrt().to(x.dtype))
        if self.offset:
            return self.offset_forward(x, hooked)
        if hooked is None and not self.hook_normalized.has_hooks:
            return self.hook_out(F.rms_norm(x, x.shape[-1:], self.w, self.eps))
        # the scale only read: the fused kernel normalises, without w; replaced: x / the hooked scale
        normalized = F.rms_norm(x, x.shape[-1:], None, self.eps) if hooked is None else x / hooked
        return self.hook_out(self.hook_normalized(normalized) * self.w)

    def offset_forward(self, x: Tensor, hooked: Optional[Tensor]) -> Tensor:
        """normalized * (offset + w), in float32 for half-precision x (cast back at the end)."""
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normalized = F.rms_norm(wide, x.shape[-1:], None, self.eps) if hooked is None else wide / hooked.to(wide.dtype)
        if self.hook_normalized.has_hooks:
            normalized = self.hook_normalized(normalized.to(x.dtype)).to(wide.dtype)
        return self.hook_out((normalized * (self.offset + self.w.to(wide.dtype))).to(x.dtype))
