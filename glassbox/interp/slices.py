"""Layer and position arguments of the cache's analysis methods, normalised in one place.

Two kinds of layer argument:

- a *block* (``get_neuron_results(layer)``, ``cache["pattern", layer]``): an index into the blocks,
  in [-n_layers, n_layers), a negative one counting from the end as in Python;
- a *stream position* (``accumulated_resid(layer)``, ``stack_head_results(layer)``...): the residual
  stream entering block ``layer``, in [0, n_layers], where n_layers is the stream entering the
  unembedding. None means n_layers, and a negative value counts from the end of those n_layers + 1
  positions, so -1 is n_layers (TransformerLens's meaning of -1) and -2 the stream entering the last
  block.

Either accepts a Python int, a numpy integer or a 0-d integer tensor (what indexing a tensor of layer
numbers gives); a bool, a float or a tensor with more than one element is refused, naming the argument.

Index arguments (``pos_slice``, ``neuron_slice``, ``batch_slice``): None (everything), an int or 0-d
integer tensor (that index; the axis is dropped), a ``slice``, a list, 1-d tensor or numpy array of
indices, or a 1-d bool mask. ``pos_slice`` also takes "last": each sequence's last real token, read
from the cache's attention mask, so a padded batch never reads a pad.
"""

from numbers import Integral
from typing import Union

import numpy as np
import torch
from torch import Tensor

from ..models.generate import last_token_positions

Index = Union[None, int, np.integer, slice, list, Tensor, np.ndarray]
PosSlice = Union[Index, str]


def as_int(value, arg: str) -> int:
    """``value`` as a Python int: an int, numpy integer or 0-d integer tensor; else a TypeError."""
    if isinstance(value, Tensor):
        if value.ndim != 0 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(f"{arg} must be an integer, got a tensor of shape {tuple(value.shape)} and dtype "
                            f"{value.dtype}")
        return int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TypeError(f"{arg} must be an integer, got {value!r}")
    return int(value)


def block_layer(cfg, layer, arg: str = "layer") -> int:
    """A block index in [0, n_layers) from one in [-n_layers, n_layers)."""
    n = cfg.n_layers
    value = as_int(layer, arg)
    if not -n <= value < n:
        raise ValueError(f"{arg}={value} is outside [-n_layers, n_layers) = [-{n}, {n}): it names a block")
    return value + n if value < 0 else value


def stream_layer(cfg, layer, arg: str = "layer") -> int:
    """A stream position in [0, n_layers] (n_layers: the unembedding's input) from None, or a value in
    [-(n_layers + 1), n_layers] (-1 is n_layers)."""
    n = cfg.n_layers
    if layer is None:
        return n
    value = as_int(layer, arg)
    if not -(n + 1) <= value <= n:
        raise ValueError(f"{arg}={value} is outside [0, n_layers={n}] (or [-{n + 1}, -1] counting from the "
                         "end, -1 being the stream entering the unembedding)")
    return value + n + 1 if value < 0 else value


def index_axis(t: Tensor, index: Index, dim: int, arg: str) -> Tensor:
    """``t`` indexed along ``dim`` by an index argument (see the module docstring)."""
    if index is None:
        return t
    if isinstance(index, np.ndarray) and index.ndim == 0:
        index = index.item()
    if isinstance(index, slice):
        return t[(slice(None),) * (dim % t.ndim) + (index,)]
    if isinstance(index, (Integral, np.integer)) or (isinstance(index, Tensor) and index.ndim == 0):
        i, size = as_int(index, arg), t.shape[dim]
        if not -size <= i < size:
            raise IndexError(f"{arg} index {i} is outside an axis of size {size}")
        return t.select(dim, i)
    return t.index_select(dim, positions(index, t.shape[dim], t.device, arg))


def positions(index, size: int, device, arg: str) -> Tensor:
    """An index list, tensor, array or bool mask as a 1-d long tensor of indices in [0, size)."""
    if isinstance(index, (str, tuple, dict, set)):
        raise TypeError(f"{arg} must be None, an int, a slice, indices or a bool mask, got {index!r}")
    ids = torch.as_tensor(np.asarray(index) if isinstance(index, list) else index, device=device)
    if ids.ndim != 1:
        raise ValueError(f"{arg} must be 1-d, got shape {tuple(ids.shape)}")
    if ids.dtype == torch.bool:
        if ids.shape[0] != size:
            raise ValueError(f"{arg} is a bool mask of length {ids.shape[0]}, the axis has {size}")
        return ids.nonzero()[:, 0]
    if ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise TypeError(f"{arg} must hold integer indices, got dtype {ids.dtype}")
    ids = ids.long()
    bad = ids[(ids < -size) | (ids >= size)]
    if bad.numel():
        raise IndexError(f"{arg} index {int(bad[0])} is outside an axis of size {size}")
    return torch.where(ids < 0, ids + size, ids)


def slice_pos(cache, t: Tensor, pos_slice: PosSlice, dim: int = -2) -> Tensor:
    """Positions of a cached activation whose pos axis is ``dim`` ([batch pos d] or [pos d] by default)."""
    if not isinstance(pos_slice, str):
        return index_axis(t, pos_slice, dim, "pos_slice")
    if pos_slice != "last":
        raise ValueError(f"pos_slice must be an int, slice, positions, a mask or 'last', got {pos_slice!r}")
    mask = cache.attention_mask
    if mask is None:
        return t.select(dim, -1)
    last = last_token_positions(mask.to(t.device), t.shape[dim])
    if cache.has_batch_dim:
        moved = t.movedim(dim % t.ndim, 1)
        return moved[torch.arange(t.shape[0], device=t.device), last]
    return t.select(dim, int(last[0]))


def neuron_labels(layers: range, d_mlp: int, neuron_slice: Index) -> list:
    """"L{l}N{n}" for each layer and each neuron that ``neuron_slice`` picks (an int picks one)."""
    picked = index_axis(torch.arange(d_mlp), neuron_slice, 0, "neuron_slice").reshape(-1).tolist()
    return [f"L{l}N{n}" for l in layers for n in picked]
