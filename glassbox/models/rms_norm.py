"""RMSNorm (Llama's normalisation) with the same hook points as LayerNorm.

out = x / sqrt(mean(x^2) + eps) * w: no centering and no bias. ``hook_scale`` [.. 1] is the divisor
sqrt(mean(x^2) + eps); ``hook_normalized`` [.. d_model] is x / scale, before w (as in every
TransformerLens version); ``hook_out`` [.. d_model] the output normalized * w. As in LayerNorm, the
fused kernel computes the output unless a hook is on ``hook_normalized`` or a hook on ``hook_scale``
replaced or edited the scale.

Footgun: RMSNorm does not remove the mean, so weight processing that relies on centering
(``center_writing_weights``) does not apply to models that use it.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_scale import hooked_scale


class RMSNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        explicit = self.hook_normalized.has_hooks
        if self.hook_scale.has_hooks or explicit:
            mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1]
            scale = (mean_square + self.eps).sqrt()
            hooked = hooked_scale(self.hook_scale, scale)
            if hooked is not None or explicit:
                return self.hook_out(self.hook_normalized(x / (scale if hooked is None else hooked)) * self.w)
        return self.hook_out(F.rms_norm(x, x.shape[-1:], self.w, self.eps))
