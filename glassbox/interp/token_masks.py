"""Padding masks and BOS removal on padded token batches, read off the tokenizer's pad and BOS ids.

Only the pads at the padded end count as padding: trailing pads with ``padding_side="right"``,
leading ones with "left". A pad id inside the text (GPT-2's pad, BOS and EOS are one id) stays a real
token. With left padding, ``prepend_bos`` and the BOS id equal to the pad id, the last leading "pad"
of each row is its BOS and is unmasked. ``padding_side=None`` takes the tokenizer's.
"""

from typing import Optional

import torch
from torch import Tensor


def _side(tokenizer, padding_side: Optional[str]) -> str:
    side = tokenizer.padding_side if padding_side is None else padding_side
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    return side


def _leading(flags: Tensor) -> Tensor:
    """True where every entry up to and including this one (along the last axis) is False."""
    return flags.long().cumsum(-1) == 0


def pad_attention_mask(tokenizer, tokens: Tensor, prepend_bos: bool,
                       padding_side: Optional[str] = None) -> Tensor:
    """[... pos] mask in the tokens' dtype and device: 1 for real tokens, 0 for end padding.

    Without a tokenizer every position is real.
    """
    mask = torch.ones_like(tokens)
    if tokenizer is None:
        return mask
    side = _side(tokenizer, padding_side)
    real = tokens.ne(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else torch.ones_like(
        tokens, dtype=torch.bool)
    if side == "right":
        mask[_leading(real.flip(-1)).flip(-1)] = 0
        return mask
    leading = _leading(real)
    mask[leading] = 0
    if prepend_bos and tokenizer.bos_token_id == tokenizer.pad_token_id:
        last = leading.sum(-1) - 1  # -1 (no pads) points at the last position, which is real anyway
        mask.scatter_(-1, last.clamp(min=0)[..., None], 1)
    return mask


def remove_bos(tokenizer, tokens: Tensor, padding_side: Optional[str] = None) -> Tensor:
    """[batch pos-1]: each row without its BOS (the first token, or after the left padding).

    A tokenizer without a BOS id returns the tokens unchanged.
    """
    if tokenizer.bos_token_id is None:
        return tokens
    if tokens.ndim != 2:
        raise ValueError(f"remove_bos takes tokens [batch pos], got shape {tuple(tokens.shape)}")
    if _side(tokenizer, padding_side) == "right":
        return tokens[..., 1:]
    if tokenizer.bos_token_id == tokenizer.pad_token_id:
        bos_at = _leading(tokens.ne(tokenizer.pad_token_id)).sum(-1) - 1
        if bool((bos_at < 0).any()):
            rows = (bos_at < 0).nonzero().flatten().tolist()
            raise ValueError(f"rows {rows} do not start with the BOS id {tokenizer.bos_token_id} (it is also "
                             "the pad id, so the BOS is the last leading pad): nothing to remove")
    else:
        bos_at = (tokens == tokenizer.bos_token_id).int().argmax(-1)
    keep = torch.ones_like(tokens, dtype=torch.bool)
    keep[torch.arange(tokens.shape[0], device=tokens.device), bos_at] = False
    return tokens[keep].view(tokens.shape[0], tokens.shape[1] - 1)
