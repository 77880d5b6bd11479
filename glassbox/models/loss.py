"""lm_loss: next-token cross-entropy over real tokens, the loss every forward and trainer uses."""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor


def lm_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"],
            attention_mask: Optional[Tensor] = None, per_token: bool = False) -> Tensor:
    """Next-token cross-entropy; positions whose input or target is padding are ignored.

    The mean is over the (input, target) pairs where both are real tokens. A mask that leaves no
    such pair (every row has at most one real token) is refused: a mean over nothing is undefined,
    and 0.0 would read as a perfect loss. ``per_token=True`` still returns the [batch pos-1] zeros.
    """
    if tokens.shape[1] < 2:
        raise ValueError("the loss needs at least 2 tokens per sequence")
    log_probs = F.log_softmax(logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    nll = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    if attention_mask is None:
        return nll if per_token else nll.mean()
    valid = attention_mask[:, 1:] & attention_mask[:, :-1]
    nll = nll.masked_fill(~valid, 0.0)  # not a product: a masked -inf logit would make inf * 0 = nan
    if per_token:
        return nll
    count = valid.sum()
    if int(count) == 0:
        raise ValueError(f"the loss has no target: attention_mask {tuple(attention_mask.shape)} leaves no "
                         "position whose token and next token are both real (every row has at most one "
                         "real token), and a mean over no targets is undefined; use per_token=True "
                         "(forward's loss_per_token=True) or give rows of at least two real tokens")
    return nll.sum() / count
