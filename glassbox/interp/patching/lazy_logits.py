"""Logits for a whole-batch metric, unembedded only at the positions the metric looks at.

TransformerLens's metric contract hands ``fn`` the full logits [prompt pos d_vocab] of one patched
run; most such metrics read one position (``logits[:, -1]``), so unembedding every position costs
more than the patched forward itself. ``LazyLogits`` is that full tensor with its positions
computed on demand: every torch operation on it first computes what the operation can see.

- Indexing whose position entry (dim 1) is an int, a slice or integer indices (``logits[:, -1]``,
  ``logits[..., -1, :]``, ``logits[rows, pos]``) computes those positions, then indexes.
- Metadata (``shape``, ``ndim``, ``dim()``, ``size()``, ``dtype``, ``device``, ``len``,
  ``numel()``) computes nothing.
- Any other operation (arithmetic, ``softmax``, ``.to``, ``.numpy()``, ``print``, writes, bool
  masks, ``None`` in an index...) computes every position first.

So wherever the metric looks, it sees the values full logits would hold; the results of operations
are plain tensors. ``filled`` is the set of positions computed so far; a caller that predicts them
(``prefill``) unembeds many variants in one matmul, and a miss is computed then and there.

Footguns: each operation costs a few microseconds of Python (``__torch_function__``). Positions not
yet computed hold arbitrary memory: a torch operation never reaches it, but the storage of a view
(``logits[:, -1].untyped_storage()``, ``as_strided`` on such a view) does. A metric that keeps the
tensor keeps alive the residual stream it is computed from.
"""

from typing import Callable, Iterable

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

METADATA = (Tensor.shape.__get__, Tensor.ndim.__get__, Tensor.dim, Tensor.size, Tensor.dtype.__get__,
            Tensor.device.__get__, Tensor.is_cuda.__get__, Tensor.layout.__get__, Tensor.__len__, Tensor.numel,
            Tensor.requires_grad.__get__)


class LazyLogits(Tensor):
    """[prompt pos d_vocab] logits whose positions are unembedded when first seen (see the module)."""

    @staticmethod
    def make(buffer: Tensor, compute: Callable[[list], Tensor], filled: Iterable[int] = ()) -> "LazyLogits":
        """``buffer`` [prompt pos d_vocab] holds the logits at ``filled``; ``compute(positions)`` gives
        the logits [prompt len(positions) d_vocab] at the others."""
        lazy = buffer.as_subclass(LazyLogits)
        lazy._buffer, lazy._compute, lazy.filled = buffer, compute, set(filled)
        return lazy

    def _fill(self, positions) -> None:
        missing = sorted(set(positions) - self.filled)
        if missing:
            index = torch.tensor(missing, dtype=torch.long, device=self._buffer.device)
            self._buffer[:, index] = self._compute(missing).to(self._buffer.dtype)
            self.filled.update(missing)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(func == m for m in METADATA):
            seq_len = None
            for lazy in _lazies(args, kwargs):
                seq_len = lazy._buffer.shape[1]
                read = None
                if func == Tensor.__getitem__ and args[0] is lazy and len(args) == 2:
                    read = positions_read(args[1], seq_len)
                lazy._fill(range(seq_len) if read is None else read)
        unwrap = lambda a: a._buffer if isinstance(a, LazyLogits) else a
        with torch._C.DisableTorchFunctionSubclass():
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))


def _lazies(args, kwargs) -> list:
    found = []
    tree_map(lambda a: found.append(a) if isinstance(a, LazyLogits) else None, (args, kwargs))
    return found


def positions_read(index, seq_len: int):
    """The positions (dim 1 of [prompt pos d_vocab]) that ``tensor[index]`` reads, or None when that
    cannot be told from the index alone (then every position is computed)."""
    entries = index if isinstance(index, tuple) else (index,)
    for entry in entries:
        if entry is None or isinstance(entry, bool) or (isinstance(entry, Tensor) and entry.dtype == torch.bool):
            return None
    ellipses = [k for k, entry in enumerate(entries) if entry is Ellipsis]
    if len(ellipses) > 1:
        return None
    if ellipses:  # stands for the dims the other entries leave out, of 3
        k = ellipses[0]
        entries = entries[:k] + (slice(None),) * max(0, 3 - (len(entries) - 1)) + entries[k + 1:]
    if len(entries) < 2:
        return None
    entry = entries[1]
    if isinstance(entry, slice):
        try:
            return set(range(seq_len)[entry])
        except TypeError:  # bounds that are not ints
            return None
    try:
        values = torch.as_tensor(entry)
    except (TypeError, ValueError, RuntimeError):
        return None
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        return None
    values = values.flatten().tolist()
    if not all(-seq_len <= v < seq_len for v in values):
        return None  # out of range: computed whole, so the indexing raises as on plain logits
    return {v % seq_len for v in values}
