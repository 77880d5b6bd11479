"""Positions and attention masks from a padding mask.

Positions count real tokens only (cumsum of the mask - 1), so left padding does not shift them.
A padded query attends to itself alone, which keeps its softmax finite; its outputs are never read.
A local (sliding-window) layer's mask also drops keys ``window`` or more positions (sequence
indices, past included) before the query, as transformers' sliding window does; while the sequence
fits the window the mask is the global one.
"""

from typing import Optional

import torch
from torch import Tensor


def positions_for(tokens: Tensor, key_mask: Optional[Tensor], past: int) -> Tensor:
    """[batch pos] position ids of the new tokens, given the mask over all keys (past + new)."""
    batch, new = tokens.shape
    if key_mask is None:
        return torch.arange(past, past + new, device=tokens.device).expand(batch, new)
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]


def attention_mask_for(key_mask: Optional[Tensor], query_len: int, key_len: int,
                       device, window: Optional[int] = None) -> Optional[Tensor]:
    """None for plain causal attention, else a bool mask (True: may attend) broadcastable to
    [batch head query_pos key_pos]; ``window``: keep only keys less than ``window`` positions back."""
    if window is not None and key_len <= window:
        window = None
    if key_mask is None and window is None:
        if query_len == key_len:
            return None
        return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)
    causal = torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)
    if window is not None:
        causal &= ~torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len - window)
    if key_mask is None:
        return causal
    mask = causal & key_mask[:, None, None, :]
    own = torch.arange(query_len, device=device)
    mask[:, 0, own, own + key_len - query_len] = True
    return mask
