"""RMSNorm (Llama's normalisation) with the same hook points as LayerNorm.

out = x / sqrt(mean(x^2) + eps) * w: no centering and no bias. ``hook_scale`` [batch pos 1] is the
divisor sqrt(mean(x^2) + eps); ``hook_normalized`` the output after w. As in LayerNorm, the fused
kernel computes the output unless a hook on ``hook_scale`` replaced or edited the scale.

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

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.hook_scale.has_hooks:
            mean_square = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / x.shape[-1]
            hooked = hooked_scale(self.hook_scale, (mean_square + self.eps).sqrt())
            if hooked is not None:
                return self.hook_normalized(x / hooked * self.w)
        return self.hook_normalized(F.rms_norm(x, x.shape[-1:], self.w, self.eps))
