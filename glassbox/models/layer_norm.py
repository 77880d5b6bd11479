"""LayerNorm with TransformerLens's hook points.

``hook_scale`` [batch pos 1] is sqrt(var + eps), the divisor; ``hook_normalized`` is the output after
the weight w and bias b. The output comes from the fused kernel unless a hook on ``hook_scale`` replaced
or edited the scale; only then is it recomputed from the hooked scale. So caching the scale changes no
bit of the output and allocates no [batch pos d_model] temporaries (see ``norm_scale.py``).
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_scale import hooked_scale


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.use_bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.hook_scale.has_hooks:
            scale = (x.var(-1, correction=0, keepdim=True) + self.eps).sqrt()
            hooked = hooked_scale(self.hook_scale, scale)
            if hooked is not None:
                out = (x - x.mean(-1, keepdim=True)) / hooked * self.w
                return self.hook_normalized(out + self.b if self.b is not None else out)
        return self.hook_normalized(F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps))
