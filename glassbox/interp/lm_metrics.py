"""Next-token metrics on logits: top-1 accuracy (the cross-entropy is ``glassbox.models.lm_loss``).

Position ``p``'s logits predict token ``p + 1``, so per-token results have ``pos - 1`` entries: the
first token is never predicted and the last position's logits have no target.
"""

from typing import Optional

import torch
from jaxtyping import Float, Shaped
from torch import Tensor

from ..models.loss import check_lm_targets


def next_token_accuracy(logits: Float[Tensor, "..."], tokens: Shaped[Tensor, "..."],
                        per_token: bool = False, attention_mask: Optional[Tensor] = None) -> Tensor:
    """Whether the top logit at each position is the next token.

    ``logits`` [batch pos d_vocab], ``tokens`` [batch pos] (see ``check_lm_targets``). Returns [batch
    pos-1] bools with ``per_token``, else the fraction correct as a float scalar: over every (position,
    next token) pair, or, with ``attention_mask`` [batch pos], over the pairs whose
    token and next token are both real. Ties in the top logit go to the lowest id (``argmax``).
    """
    check_lm_targets(logits, tokens, "accuracy")
    if tokens.shape[1] < 2:
        raise ValueError("accuracy needs at least 2 tokens per sequence (position p predicts token p + 1)")
    correct = logits[:, :-1].argmax(dim=-1) == tokens[:, 1:]
    if attention_mask is not None:
        if attention_mask.shape != tokens.shape:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the tokens' shape "
                             f"{tuple(tokens.shape)}")
        valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
        correct = correct & valid
    if per_token:
        return correct
    count = correct.numel() if attention_mask is None else int(valid.sum())
    if count == 0:
        raise ValueError("the attention mask leaves no (token, next token) pair of real tokens to score")
    return correct.sum().to(torch.float32) / count
