"""Checking and converting what a caller passes as token ids, masks and flags, before anything runs.

Contract:
- Token ids are an integer tensor or numpy array, [batch pos] or [pos]. Every integer dtype is
  accepted where its values convert exactly: int8/int16/uint8/uint16/uint32 become int64 (each value
  fits); uint64 is read as int64 after checking that no value is above 2**63 - 1 (such a value is
  refused by name, never wrapped to a negative id). The range [0, d_vocab) is checked afterwards.
- An attention mask is a tensor, numpy array or (nested) list of 0/1 or bools of the tokens' shape.
- Flags (``prepend_bos``, ``loss_per_token``, ...) are ``bool`` (or None where a default applies):
  a string such as ``"False"`` is truthy, so it is refused by name rather than read as True.
"""

from typing import Optional

import numpy as np
import torch
from torch import Tensor

PADDING_SIDES = ("left", "right")
# int64 via a plain cast, exact for every value of these dtypes.
_WIDEN = {torch.uint8, torch.int8, torch.int16} | {
    getattr(torch, name) for name in ("uint16", "uint32") if hasattr(torch, name)}
_UINT64 = getattr(torch, "uint64", None)


def check_flag(name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, (bool, np.bool_)):
        allowed = "True, False or None" if optional else "True or False"
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")


def check_padding_side(padding_side) -> None:
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")


def as_array_tensor(value, what: str) -> Tensor:
    """A tensor from a tensor, numpy array or nested list; an error naming ``what`` otherwise."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray) or isinstance(value, (list, tuple)):
        try:
            return torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{what} must be a rectangular array of numbers, got {type(value).__name__}: "
                             f"{err}") from None
    raise TypeError(f"{what} must be a tensor, a numpy array or a list, got {type(value).__name__}")


def ids_as_integers(tokens: Tensor) -> Tensor:
    """Token ids in a dtype the embedding takes (int32 or int64), converted exactly or refused."""
    if tokens.dtype in _WIDEN:
        return tokens.to(torch.int64)
    if _UINT64 is not None and tokens.dtype == _UINT64:
        signed = tokens.view(torch.int64)  # the same bits: values >= 2**63 read as negative
        if tokens.numel() and bool((signed < 0).any()):
            bad = int(signed[signed < 0][0]) + 2**64
            raise ValueError(f"token id {bad} (dtype torch.uint64) is outside the int64 range of token ids")
        return signed
    return tokens


def check_tokens(tokens: Tensor, n_ctx: int, d_vocab: int, past: int = 0) -> None:
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"token ids must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.ndim != 2:
        raise ValueError(f"token ids must be [batch pos], got shape {tuple(tokens.shape)}")
    if tokens.numel() == 0:
        raise ValueError(f"token ids are empty: shape {tuple(tokens.shape)}")
    if past + tokens.shape[1] > n_ctx:
        raise ValueError(f"sequence of {past + tokens.shape[1]} tokens is longer than n_ctx={n_ctx}")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside [0, d_vocab={d_vocab})")


def as_mask(mask, shape: tuple, device: torch.device, against: str = "tokens have") -> Tensor:
    """A bool [batch pos] padding mask of ``shape``, every row with a real token; errors name the value."""
    mask = as_array_tensor(mask, "attention_mask")
    if mask.dtype in _WIDEN or (_UINT64 is not None and mask.dtype == _UINT64):
        mask = mask.to(torch.int64)
    mask = mask.to(device)
    if mask.ndim == 1:
        mask = mask[None]
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, {against} {tuple(shape)}")
    if mask.dtype != torch.bool:
        odd = (mask != 0) & (mask != 1)
        if bool(odd.any()):
            raise ValueError(f"attention_mask holds {mask[odd][0].item()!r}; use 1 for real tokens and 0 for padding")
    mask = mask.bool()
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(empty.nonzero()[0, 0])} has no real token")
    return mask


def as_tokens(input, device: torch.device) -> Tensor:
    """Token ids [batch pos] on ``device`` from a tensor or numpy array of ids ([pos] becomes [1 pos])."""
    if isinstance(input, np.ndarray):
        if not (np.issubdtype(input.dtype, np.integer) or input.dtype == np.bool_):
            raise ValueError(f"token ids must be integers, got a numpy array of dtype {input.dtype}")
        input = torch.from_numpy(np.ascontiguousarray(input))
    if input.device.type == "meta":
        raise ValueError("token ids are on the meta device, which holds shapes but no values")
    tokens = ids_as_integers(input.to(device))
    return tokens[None] if tokens.ndim == 1 else tokens


def optional_mask(mask, shape: tuple, device: torch.device, against: str = "tokens have") -> Optional[Tensor]:
    return None if mask is None else as_mask(mask, shape, device, against)
