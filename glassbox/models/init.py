"""Weight initialisation, chosen by ``cfg.init_scheme``.

"gpt2": every matrix ~ N(0, init_range); the two matrices that write into the residual stream at the
end of a block (W_O, W_out) get init_range / sqrt(2 n_layers), as in GPT-2, so the residual stream's
variance does not grow with depth.

"truncated_normal" (the modern LM's): a projection ~ N(0, 2 / (fan_in + fan_out)) truncated to
three standard deviations, where the fans of a per-head weight count all heads together
(W_Q [head d_model d_head]: d_model in, head * d_head out); the embeddings ~ N(0, 1) truncated to
[-3, 3]; init_range is not used.

Both: norm weights are 1, biases 0 (per-head biases b_Q [head d_head] included). The sinusoidal
table (a buffer) and the rotary tables (built on use, not module state) are not touched.
"""

import math

import torch
from torch import Tensor, nn

from .config import Config

RESIDUAL_WRITERS = ("W_O", "W_out")
EMBEDDINGS = ("W_E", "W_pos")


@torch.no_grad()
def init_weights(model: nn.Module, cfg: Config, generator: torch.Generator = None) -> None:
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "b" or leaf.startswith("b_"):  # biases, including the per-head [head d_head] ones
            param.zero_()
        elif param.ndim >= 2:
            if cfg.init_scheme == "truncated_normal":
                truncated_normal_(param, 1.0 if leaf in EMBEDDINGS else fan_std(leaf, param), generator)
                continue
            std = cfg.init_range
            if leaf in RESIDUAL_WRITERS:
                std /= math.sqrt(2 * cfg.n_layers)
            param.normal_(0.0, std, generator=generator)
        elif leaf == "w":
            param.fill_(1.0)
        else:
            param.zero_()


def fan_std(leaf: str, param: Tensor) -> float:
    """sqrt(2 / (fan_in + fan_out)); the fans of a per-head weight are d_model and head * d_head."""
    if param.ndim == 3:
        head, a, b = param.shape  # W_O is [head d_head d_model]; W_Q/W_K/W_V are [head d_model d_head]
        fans = head * a + b if leaf == "W_O" else a + head * b
    else:
        fans = param.shape[0] + param.shape[1]
    return math.sqrt(2.0 / fans)


def truncated_normal_(param: Tensor, std: float, generator: torch.Generator = None) -> None:
    nn.init.trunc_normal_(param, 0.0, std, -3 * std, 3 * std, generator=generator)
