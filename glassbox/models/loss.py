"""lm_loss: next-token cross-entropy over real tokens, the loss every forward and trainer uses."""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Shaped
from torch import Tensor


def lm_loss(logits: Float[Tensor, "..."], tokens: Shaped[Tensor, "..."],
            attention_mask: Optional[Tensor] = None, per_token: bool = False) -> Tensor:
    """Next-token cross-entropy; positions whose input or target is padding are ignored.

    ``logits`` [batch pos d_vocab] and ``tokens`` [batch pos] (checked by ``check_lm_targets``, not by
    the annotations, so that a mismatch is a ValueError naming both shapes). The mean is over the
    (input, target) pairs where both are real tokens. A mask that leaves no such pair (every row has at
    most one real token) is refused: a mean over nothing is undefined, and 0.0 would read as a perfect
    loss. ``per_token=True`` still returns the [batch pos-1] zeros.
    """
    check_lm_targets(logits, tokens)
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


def check_lm_targets(logits: Tensor, tokens: Tensor, what: str = "the loss") -> None:
    """``logits`` [batch pos d_vocab] and integer ``tokens`` [batch pos] of the same batch and positions,
    every target (``tokens[:, 1:]``, what position p's logits predict) an id in [0, d_vocab); else a
    ValueError naming the shapes or the id. The first token is never a target, so it is not checked."""
    if not isinstance(logits, Tensor) or logits.ndim != 3:
        got = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"{what}: logits must be [batch pos d_vocab], got {got}")
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype.is_complex \
            or tokens.dtype == torch.bool:
        got = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{what}: tokens must be an integer tensor of token ids [batch pos], got {got}")
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"{what}: logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} differ in "
                         "[batch pos]")
    targets, d_vocab = tokens[:, 1:], logits.shape[-1]
    outside = (targets < 0) | (targets >= d_vocab)
    if targets.numel() and bool(outside.any()):
        bad = int(targets[outside][0])
        raise ValueError(f"{what}: token id {bad} (a target, in tokens[:, 1:]) is outside the logits' "
                         f"[0, d_vocab={d_vocab})")
