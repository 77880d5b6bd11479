"""Small tensor helpers researchers reach for in notebooks (TransformerLens's ``utils`` names).

``to_numpy`` copies to the CPU (bfloat16 goes through float32: numpy has no bfloat16);
``get_corner`` is the leading ``n`` entries of every axis; ``remove_batch_dim`` drops a leading axis
of length 1 and leaves any other tensor as it is (footgun: a batch of one *other* axis is not
touched; a real batch of 1 always is).
"""

import numpy as np
import torch
from torch import Tensor


def to_numpy(value) -> np.ndarray:
    """A numpy array of a tensor (detached, on the CPU), array, list, tuple or Python scalar."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return np.array(value)
    if isinstance(value, Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.to(torch.float32)
        return value.numpy()
    if isinstance(value, (int, float, bool, str, np.generic)):
        return np.array(value)
    raise ValueError(f"to_numpy got an invalid type, {type(value).__name__}: it takes a tensor, array, list, tuple or "
                     "scalar")


def get_corner(tensor, n: int = 3):
    """The first ``n`` entries along every axis (a tensor, array or FactoredMatrix)."""
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def remove_batch_dim(tensor: Tensor) -> Tensor:
    """``tensor[0]`` when the first axis has length 1, else ``tensor`` unchanged."""
    return tensor.squeeze(0) if tensor.shape[0] == 1 else tensor


def transpose(tensor: Tensor) -> Tensor:
    """The last two axes swapped, whatever leads."""
    return tensor.transpose(-1, -2)


def is_square(x: Tensor) -> bool:
    """A 2-D tensor with as many rows as columns."""
    return x.ndim == 2 and x.shape[0] == x.shape[1]


def is_lower_triangular(x: Tensor) -> bool:
    """Square, with every entry above the diagonal exactly zero."""
    return is_square(x) and bool(x.equal(x.tril()))
