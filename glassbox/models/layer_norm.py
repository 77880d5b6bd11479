"""LayerNorm with TransformerLens 3.x's hook points, plus ``hook_out``.

For input x [batch pos d_model] (or [batch pos head d_model], see below): ``hook_scale`` [.. 1] is
sqrt(var + eps), the divisor; ``hook_normalized`` [.. d_model] is (x - mean) / scale, before the weight
w and bias b (as in TransformerLens 3.x); ``hook_out`` [.. d_model] is the norm's output
normalized * w + b, what the next component reads. The leading axes are [batch pos], or [batch pos head] for ln1 under
``use_attn_in`` / ``use_split_qkv_input``.

The output comes from the fused kernel (no [.. d_model] temporaries, the same bits as an unhooked run)
unless a hook could see or change what the kernel hides: a hook on ``hook_normalized``, or one on
``hook_scale`` that replaced or edited the scale (``norm_scale.py``). Then w and b are applied after
``hook_normalized``: the normalised value comes from the fused kernel without w and b, or, when the
scale was replaced, from (x - mean) / the hooked scale. Both agree with the fused output to float rounding.
Footgun: before 3.x semantics, ``hook_normalized`` held the post-affine output; that is ``hook_out`` now.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_scale import hooked_scale


class LayerNorm(nn.Module):
    def __init__(self, cfg: Config, length: Optional[int] = None):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        length = cfg.d_model if length is None else length
        self.w = nn.Parameter(torch.ones(length))
        self.b = nn.Parameter(torch.zeros(length)) if cfg.use_bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos *head d_model"]) -> Float[Tensor, "batch pos *head d_model"]:
        hooked = None
        if self.hook_scale.has_hooks:
            # in float32 for half-precision x: a variance above 65504 is inf in float16
            wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            scale = (wide.var(-1, correction=0, keepdim=True) + self.eps).sqrt().to(x.dtype)
            hooked = hooked_scale(self.hook_scale, scale)
        if hooked is None and not self.hook_normalized.has_hooks:
            return self.hook_out(F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps))
        if hooked is None:  # the scale was only read: the fused kernel normalises, without w and b
            normalized = F.layer_norm(x, x.shape[-1:], None, None, self.eps)
        else:
            normalized = (x - x.mean(-1, keepdim=True)) / hooked
        out = self.hook_normalized(normalized) * self.w
        return self.hook_out(out.add_(self.b) if self.b is not None else out)
