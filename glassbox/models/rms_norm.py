"""RMSNorm (Llama's normalisation) with the same hook points as LayerNorm.

out = x / sqrt(mean(x^2) + eps) * w: no centering and no bias. ``hook_scale`` [batch pos 1] is the
divisor sqrt(mean(x^2) + eps); ``hook_normalized`` the output after w. When nothing is attached to
``hook_scale`` the fused kernel computes the same numbers (to float rounding).

Footgun: RMSNorm does not remove the mean, so weight processing that relies on centering
(``center_writing_weights``) does not apply to models that use it.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config


class RMSNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if not self.hook_scale.has_hooks:
            return self.hook_normalized(F.rms_norm(x, x.shape[-1:], self.w, self.eps))
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w)
