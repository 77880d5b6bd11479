"""The gated feed-forward layer (SwiGLU with act_fn "silu"): W_out applied to act(x @ W_gate) * (x @ W_in).

W_gate and W_in [d_model d_mlp], W_out [d_mlp d_model], as in TransformerLens. ``hook_pre`` is the
gate's pre-activation x @ W_gate (+ b_gate), ``hook_pre_linear`` the ungated branch x @ W_in (+ b_in),
``hook_post`` their product act(pre) * pre_linear, all [batch pos d_mlp].

Where the biases go (``cfg.gated_mlp_bias``): "inputs" (transformers' layers, nn.Linear's) adds b_gate
and b_in to the two projections as above; "product" (TransformerLens's GatedMLP) has no b_gate and adds
b_in to the product, hook_post = act(x @ W_gate) * (x @ W_in) + b_in. The two differ whenever b_in is
not zero. Without biases (``mlp_bias=False``) they are the same layer.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .activations import ALL_ACTIVATIONS
from .ops import linear


class GatedMLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        on_inputs = cfg.gated_mlp_bias == "inputs"
        self.b_gate = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.mlp_bias and on_inputs else None
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.mlp_bias else None
        self.b_in_on_product = cfg.mlp_bias and not on_inputs
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.mlp_bias else None
        self.act = ALL_ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(linear(x, self.W_gate, self.b_gate))
        if self.b_in_on_product:
            pre_linear = self.hook_pre_linear(linear(x, self.W_in, None))
            post = self.hook_post(self.act(pre) * pre_linear + self.b_in)
        else:
            pre_linear = self.hook_pre_linear(linear(x, self.W_in, self.b_in))
            post = self.hook_post(self.act(pre) * pre_linear)
        return linear(post, self.W_out, self.b_out)
