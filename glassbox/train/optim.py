"""The optimizer and learning-rate schedule of the trainer.

AdamW, with weight decay only on the weight matrices (the parameters named ``W_*``: W_E, W_pos,
W_Q/W_K/W_V/W_O, W_in/W_out); norm weights and biases are not decayed, as in GPT-2 and nanoGPT.
Footgun: the attention biases b_Q/b_K/b_V are 2-D ([head d_head]), so "ndim >= 2" would wrongly
decay them; the name decides.
The schedule is a linear warm-up from 0 to ``lr`` over ``warmup_steps``, then a cosine decay to
``lr * min_lr_frac`` at ``total_steps``; it is a pure function of the step, so resuming needs
only the step number.
"""

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list:
    """Two AdamW groups: weight matrices (decayed) and the rest (not), each in a fixed order."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if name.rsplit(".", 1)[-1].startswith("W_") else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95),
                   eps: float = 1e-8) -> torch.optim.AdamW:
    # NaN fails every comparison, so "not x > 0" alone would let it through "x < 0" checks.
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    # foreach=False: the same per-tensor update on every device, so CPU runs are reproducible.
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps,
                             foreach=False)


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int, min_lr_frac: float = 0.1) -> float:
    """The learning rate for optimizer step ``step`` (0-based)."""
    if total_steps <= 0 or not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"need 0 <= warmup_steps ({warmup_steps}) <= total_steps ({total_steps}), total > 0")
    if not 0.0 <= min_lr_frac <= 1.0:
        raise ValueError(f"min_lr_frac must be in [0, 1], got {min_lr_frac!r}")
    if not math.isfinite(lr):
        raise ValueError(f"lr must be finite, got {lr!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    floor = lr * min_lr_frac
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
