"""The feed-forward layer: W_in [d_model d_mlp], activation, W_out [d_mlp d_model].

``hook_pre`` is the pre-activation, ``hook_post`` the activation's output, both [batch pos d_mlp].
"""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .ops import linear


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh approximation of GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"gelu_new": gelu_new, "gelu": F.gelu, "relu": F.relu, "silu": F.silu}


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp)) if cfg.mlp_bias else None
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.mlp_bias else None
        self.act = ACTIVATIONS[cfg.act_fn]
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        post = self.hook_post(self.act(pre))
        return linear(post, self.W_out, self.b_out)
