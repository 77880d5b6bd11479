"""The feed-forward layer: W_in [d_model d_mlp], activation, W_out [d_mlp d_model].

``hook_pre`` is the pre-activation, ``hook_post`` the activation's output, both [batch pos d_mlp].
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .activations import ACTIVATIONS, ALL_ACTIVATIONS, gelu_new  # noqa: F401 (ACTIVATIONS, gelu_new: old homes)
from .config import Config
from .ops import linear


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.mlp_bias else None
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.mlp_bias else None
        self.act = ALL_ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        post = self.hook_post(self.act(pre))
        return linear(post, self.W_out, self.b_out)
