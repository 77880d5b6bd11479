"""What an export reads: a corpus as fixed-length rows ("windows") of token ids.

- ``text_windows``: a text file, encoded as ONE token stream (``glassbox.train.data.encode_text``, no special
  tokens), cut into consecutive windows of ``context_size - 1`` stream tokens, each with the BOS id in
  front (as ``glassbox.train`` builds training windows); the last partial window is dropped. Held in
  memory (int32), so it travels with the job to Ray workers: for corpora beyond ~10^8 tokens, pretokenize
  to a ``datasets`` folder instead.
- ``dataset_windows``: a pretokenized Hugging Face ``datasets`` folder (``save_to_disk``) with an
  ``input_ids`` or ``tokens`` column of equal-length rows, used as is (no BOS added: SAELens's rule, the
  pretokenizer put in what the model needs). Memory-mapped and opened lazily by each worker.

Both give ``rows(start, stop)``: int64 [n context_size] on the CPU, and ``describe()``: what the manifest
records to recognise the same corpus on resume (a checksum of the tokens, or the sha256 of every file of
the dataset's folder, once per run: see ``fingerprint.py`` for the cost).
"""

import hashlib
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from .job import SCALE_EXTRA

TOKEN_COLUMNS = ("input_ids", "tokens")


class ArrayWindows:
    """Token windows held in memory: an int array [n_windows context_size]."""

    def __init__(self, windows: np.ndarray, source: str = "array"):
        windows = np.ascontiguousarray(windows)
        if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 1 or windows.dtype.kind not in "iu":
            raise ValueError(f"windows must be a non-empty int array [n_windows context_size], got "
                             f"{windows.dtype} {windows.shape}")
        self.windows = windows.astype(np.int32) if windows.max() < 2 ** 31 else windows.astype(np.int64)
        self.source = source

    def __len__(self) -> int:
        return self.windows.shape[0]

    @property
    def context_size(self) -> int:
        return self.windows.shape[1]

    def rows(self, start: int, stop: int) -> Int[Tensor, "n pos"]:
        return torch.from_numpy(self.windows[start:stop].astype(np.int64))

    def describe(self) -> dict:
        return {"kind": "tokens", "source": self.source, "n_windows": len(self), "context_size": self.context_size,
                "sha256": hashlib.sha256(self.windows.astype(np.int64).tobytes()).hexdigest()}


class DatasetWindows:
    """The token column of a pretokenized ``datasets`` folder, opened on first use (and again after pickling)."""

    def __init__(self, path: Union[str, Path], column: Optional[str] = None):
        self.path = str(Path(path).resolve())
        self._dataset = None
        dataset = self._open()
        names = dataset.column_names
        if column is None:
            column = next((c for c in TOKEN_COLUMNS if c in names), None)
            if column is None:
                raise ValueError(f"the dataset {path} has no token column ({' or '.join(TOKEN_COLUMNS)}); its "
                                 f"columns are {names}")
        elif column not in names:
            raise ValueError(f"the dataset {path} has no column {column!r}; its columns are {names}")
        self.column = column
        if len(dataset) < 1:
            raise ValueError(f"the dataset {path} has no rows")
        first = np.asarray(dataset[0][column])
        if first.ndim != 1 or first.dtype.kind not in "iu":
            raise ValueError(f"{path}: column {column!r} must hold rows of token ids, got {first.dtype} "
                             f"{first.shape} in row 0")
        self._context_size = int(first.shape[0])
        self._fingerprint = getattr(dataset, "_fingerprint", None)
        self._files = None

    def _open(self):
        if self._dataset is None:
            try:
                import datasets
            except ModuleNotFoundError as error:
                raise ImportError(f"reading a --dataset folder needs datasets: {SCALE_EXTRA}") from error
            if not Path(self.path).is_dir():
                raise FileNotFoundError(f"dataset folder {self.path} does not exist")
            self._dataset = datasets.load_from_disk(self.path)
            if not isinstance(self._dataset, datasets.Dataset):
                raise ValueError(f"{self.path} holds a DatasetDict ({list(self._dataset)}); give one split's folder")
        return self._dataset

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_dataset"] = None  # each process memory-maps the folder itself
        return state

    def __len__(self) -> int:
        return len(self._open())

    @property
    def context_size(self) -> int:
        return self._context_size

    def rows(self, start: int, stop: int) -> Int[Tensor, "n pos"]:
        values = self._open().with_format("numpy")[start:stop][self.column]
        rows = np.asarray(values) if not isinstance(values, list) else np.stack([np.asarray(v) for v in values])
        if rows.ndim != 2 or rows.shape[1] != self._context_size:
            raise ValueError(f"{self.path}: rows {start}:{stop} of column {self.column!r} are not all "
                             f"{self._context_size} tokens long (got shape {rows.shape})")
        return torch.from_numpy(rows.astype(np.int64))

    def files(self) -> dict:
        """``{name: {"bytes", "sha256"}}`` of the folder's files (computed once): its data, not its name."""
        if self._files is None:
            from .fingerprint import sha256_file

            self._files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                           for p in sorted(Path(self.path).iterdir()) if p.is_file()}
        return self._files

    def describe(self) -> dict:
        return {"kind": "dataset", "source": self.path, "column": self.column, "n_windows": len(self),
                "context_size": self.context_size, "fingerprint": self._fingerprint, "files": self.files()}


def text_windows(path: Union[str, Path], tokenizer, context_size: int, prepend_bos: bool = True) -> ArrayWindows:
    """A text file -> consecutive windows of ``context_size`` tokens (see the module docstring)."""
    from ..train.data import encode_text  # call time: train is a sibling layer

    if isinstance(context_size, bool) or not isinstance(context_size, int) or context_size < 1 + prepend_bos:
        raise ValueError(f"context_size must be an int >= {1 + prepend_bos}, got {context_size!r}")
    if prepend_bos and getattr(tokenizer, "bos_token_id", None) is None:
        raise ValueError("prepend_bos=True but the tokenizer has no BOS token")
    path = Path(path)
    stream = encode_text(path.read_text(encoding="utf-8"), tokenizer).numpy()
    body = context_size - 1 if prepend_bos else context_size
    n = len(stream) // body
    if n < 1:
        raise ValueError(f"{path} encodes to {len(stream)} tokens, fewer than one window of {body} "
                         f"(context_size={context_size})")
    windows = stream[: n * body].reshape(n, body)
    if prepend_bos:
        windows = np.concatenate([np.full((n, 1), tokenizer.bos_token_id, dtype=windows.dtype), windows], axis=1)
    return ArrayWindows(windows, source=str(path.resolve()))


def dataset_windows(path: Union[str, Path], context_size: Optional[int] = None,
                    column: Optional[str] = None) -> DatasetWindows:
    """A pretokenized ``datasets`` folder; ``context_size``, when given, must equal its rows' length."""
    windows = DatasetWindows(path, column)
    if context_size is not None and context_size != windows.context_size:
        raise ValueError(f"context_size={context_size} but the rows of {path} ({windows.column}) hold "
                         f"{windows.context_size} tokens; pass --context-size {windows.context_size} or none")
    return windows
