"""LayerNorm with TransformerLens's hook points.

``hook_scale`` [batch pos 1] is sqrt(var + eps), the divisor; ``hook_normalized`` is the output after
the weight w and bias b. When nothing is attached to ``hook_scale``, the fused kernel computes the same
numbers (to float rounding) without materialising the scale.
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.use_bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if not self.hook_scale.has_hooks:
            return self.hook_normalized(F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps))
        centered = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((centered.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        out = centered / scale * self.w
        if self.b is not None:
            out = out + self.b
        return self.hook_normalized(out)
