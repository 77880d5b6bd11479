"""Weight initialisation: GPT-2's scheme.

Every matrix ~ N(0, init_range); the two matrices that write into the residual stream at the end of
a block (W_O, W_out) get init_range / sqrt(2 n_layers), as in GPT-2, so the residual stream's
variance does not grow with depth. Norm weights are 1, biases 0.
"""

import math

import torch
from torch import nn

from .config import Config

RESIDUAL_WRITERS = ("W_O", "W_out")


@torch.no_grad()
def init_weights(model: nn.Module, cfg: Config, generator: torch.Generator = None) -> None:
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if param.ndim >= 2:
            std = cfg.init_range
            if leaf in RESIDUAL_WRITERS:
                std /= math.sqrt(2 * cfg.n_layers)
            param.normal_(0.0, std, generator=generator)
        elif leaf == "w":
            param.fill_(1.0)
        else:
            param.zero_()
