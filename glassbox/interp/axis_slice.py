"""Slice: one object for "which entries along one axis", as TransformerLens's ``utils.Slice``.

Modes, by the input:
  - ``None``: identity (``apply`` returns the tensor unchanged; it never adds an axis);
  - an ``int``: index with it, which removes the axis (``Slice.unwrap`` turns an int into ``[int]``
    so that the axis stays);
  - a ``tuple``: the arguments of Python's ``slice`` (``(k,)`` is ``:k``, ``(a, b)`` is ``a:b``,
    ``(a, b, s)`` is ``a:b:s``); a ``slice`` is taken as it is;
  - a ``list``, numpy array or tensor: the entries at those indices (or a boolean mask), kept as a
    numpy array, so the axis keeps its place and takes the length of the index.

Footgun: ``True``/``False`` are refused (TransformerLens reads them as the ints 1 and 0); a 0-d
tensor or array is an array index, which, like an int, removes the axis.
"""

from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .tensor_utils import to_numpy

SliceInput = Optional[Union[int, Tuple[int], Tuple[int, int], Tuple[int, int, int], List[int], Tensor,
                            np.ndarray, slice]]


class Slice:
    """Entries along one axis; ``apply(tensor, dim)`` picks them, ``indices(n)`` lists them."""

    def __init__(self, input_slice=None):  # SliceInput; checked here, so a bad one gets a clear error
        if isinstance(input_slice, bool) or isinstance(input_slice, np.bool_):
            raise ValueError(f"Slice takes an int, tuple, slice, list, array, tensor or None, got the bool "
                             f"{input_slice!r}")
        if isinstance(input_slice, tuple):
            if not 1 <= len(input_slice) <= 3:
                raise ValueError(f"a tuple Slice holds 1 to 3 slice arguments, got {input_slice!r}")
            self.slice, self.mode = slice(*input_slice), "slice"
        elif isinstance(input_slice, (int, np.integer)):
            self.slice, self.mode = int(input_slice), "int"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, (list, Tensor, np.ndarray)):
            array = to_numpy(input_slice)
            if not array.size:
                array = array.astype(np.int64)  # [] reads as float64; an empty index is an integer one
            elif array.dtype != np.bool_ and not np.issubdtype(array.dtype, np.integer):
                raise ValueError(f"an index Slice needs integers or booleans, got dtype {array.dtype}")
            self.slice, self.mode = array, "array"
        elif input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        else:
            raise ValueError(f"Slice takes an int, tuple, slice, list, array, tensor or None, got "
                             f"{type(input_slice).__name__} {input_slice!r}")

    def apply(self, tensor: Tensor, dim: int = 0) -> Tensor:
        """``tensor`` with this slice applied along ``dim`` (negative counts from the end)."""
        if not -tensor.ndim <= dim < tensor.ndim:
            raise IndexError(f"dim={dim} is out of range for a tensor of {tensor.ndim} dims {tuple(tensor.shape)}")
        index = self.slice
        if self.mode == "array":
            index = torch.as_tensor(index, device=tensor.device)
        return tensor[(slice(None),) * (dim % tensor.ndim) + (index,)]

    def indices(self, max_ctx: Optional[int] = None) -> np.ndarray:
        """The indices this slice picks from an axis of length ``max_ctx`` (an int's is ``array([i])``)."""
        if self.mode == "int":
            return np.array([self.slice], dtype=np.int64)
        if max_ctx is None:
            raise ValueError("max_ctx must be given for a Slice that is not an int")
        return np.arange(max_ctx, dtype=np.int64)[self.slice]

    def __repr__(self) -> str:
        return f"Slice: {self.slice} Mode: {self.mode} "

    @classmethod
    def unwrap(cls, slice_input: Union["Slice", SliceInput]) -> "Slice":
        """A Slice as it is; anything else made one, an int as ``[int]`` so the axis is kept."""
        if isinstance(slice_input, Slice):
            return slice_input
        if isinstance(slice_input, (int, np.integer)) and not isinstance(slice_input, (bool, np.bool_)):
            slice_input = [int(slice_input)]
        return cls(slice_input)
