"""LayerNorm with TransformerLens 3.x's hook points, plus ``hook_out``.

For input x [batch pos d_model] (or [batch pos head d_model], see below): ``hook_scale`` [.. 1] is
sqrt(var + eps), the divisor; ``hook_normalized`` [.. d_model] is (x - mean) / scale, before the weight
w and bias b (as in TransformerLens 3.x); ``hook_out`` [.. d_model] is the norm's output
normalized * w + b, what the next component reads. The leading axes are [batch pos], or [batch pos head] for ln1 under
``use_attn_in`` / ``use_split_qkv_input``.

The output is the fused kernel's (the same bits as an unhooked run) unless a hook on ``hook_scale`` or
``hook_normalized`` changed the value it saw; then it is recomputed from what the hooks left
(``norm_hooks.py``: when, and what autograd sees). The scale and normalised value those hooks see are
computed on the side: the scale as sqrt(var + eps), the normalised value by the fused kernel without w
and b (or, when a hook changed the scale, as (x - mean) / that scale).
Footgun: before 3.x semantics, ``hook_normalized`` held the post-affine output; that is ``hook_out`` now.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .norm_hooks import HookedNorm


class LayerNorm(HookedNorm):
    def __init__(self, cfg: Config, length: Optional[int] = None):
        super().__init__()
        self.eps = cfg.layer_norm_eps
        length = cfg.d_model if length is None else length
        self.w = nn.Parameter(torch.ones(length))
        self.b = nn.Parameter(torch.zeros(length)) if cfg.use_bias else None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def kernel(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)

    def scale(self, x: Tensor) -> Tensor:
        # in float32 for half-precision x: a variance above 65504 is inf in float16
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return (wide.var(-1, correction=0, keepdim=True) + self.eps).sqrt().to(x.dtype)

    def kernel_normalized(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], None, None, self.eps)

    def from_scale(self, x: Tensor, scale: Tensor) -> Tensor:
        return (x - x.mean(-1, keepdim=True)) / scale

    def affine(self, normalized: Tensor, x: Tensor) -> Tensor:
        out = normalized * self.w
        return out.add_(self.b) if self.b is not None else out
