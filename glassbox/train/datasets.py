"""Text documents -> fixed-length rows of tokens, and data loaders over local text.

``pack_documents`` is TransformerLens's ``tokenize_and_concatenate`` rule for one group of documents:
each is tokenized without special tokens, the documents are joined with one EOS id between each pair,
and the stream is cut into rows of ``max_length - 1`` tokens (``max_length`` without the BOS), the
remainder dropped; ``add_bos_token`` puts the BOS id in front of every row. A group shorter than
one row becomes one row padded with the pad id (the EOS id when the tokenizer has no pad token).

Footgun (TransformerLens's, kept so rows match): the rule runs per group, and a group is one
``datasets.map`` batch (1000 documents) of one of ``num_proc`` contiguous shards, so every group's
remainder is dropped and the rows depend on ``num_proc``. ``document_groups`` gives those groups.
Unlike TransformerLens, the tokenizer is never changed (no ``<PAD>`` token is added to it).

``datasets`` is an optional extra, imported only when a ``datasets.Dataset`` is given or a cached
Hugging Face dataset is read; glassbox never downloads one (``cached_hf_dataset``).
"""

import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

MAP_BATCH = 1000  # datasets.map's default batch size, which fixes TransformerLens's groups


def pack_documents(texts, tokenizer, max_length: int = 1024, add_bos_token: bool = True) -> Tensor:
    """One group of documents -> [rows max_length] int64 token rows (see the module docstring)."""
    seq_len = _seq_len(tokenizer, max_length, add_bos_token)
    if not texts:
        return torch.zeros((0, max_length), dtype=torch.long)
    if not all(isinstance(t, str) for t in texts):
        bad = next(t for t in texts if not isinstance(t, str))
        raise ValueError(f"documents must be strings, got {type(bad).__name__} {bad!r:.60}")
    # verbose=False: a long document exceeds model_max_length, which is harmless before it is cut into rows
    encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    pieces = []
    for i, row in enumerate(encoded):
        if i:
            pieces.append(np.array([tokenizer.eos_token_id], dtype=np.int64))
        pieces.append(np.asarray(row, dtype=np.int64))
    stream = np.concatenate(pieces)
    if len(stream) < seq_len:
        pad = tokenizer.pad_token_id if tokenizer.pad_token is not None else tokenizer.eos_token_id
        stream = np.concatenate([stream, np.full(seq_len - len(stream), pad, dtype=np.int64)])
    n_rows = len(stream) // seq_len
    rows = torch.from_numpy(stream[: n_rows * seq_len].reshape(n_rows, seq_len).copy())
    if add_bos_token:
        rows = torch.cat([torch.full((n_rows, 1), tokenizer.bos_token_id, dtype=torch.long), rows], dim=1)
    return rows


def _seq_len(tokenizer, max_length: int, add_bos_token: bool) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1 + bool(add_bos_token):
        raise ValueError(f"max_length must be an int >= {1 + bool(add_bos_token)} (add_bos_token="
                         f"{add_bos_token}), got {max_length!r}")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token, which separates the documents")
    if add_bos_token and tokenizer.bos_token_id is None:
        raise ValueError("add_bos_token=True but the tokenizer has no BOS token")
    return max_length - 1 if add_bos_token else max_length


def document_groups(n_docs: int, num_proc: Optional[int] = None, batch: int = MAP_BATCH) -> List[range]:
    """The index ranges ``datasets.map(batched=True, num_proc=num_proc)`` hands to its function, in order."""
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 0):
        raise ValueError(f"num_proc must be None or an int >= 0, got {num_proc!r}")
    shards = min(num_proc or 1, max(n_docs, 1))
    div, mod = divmod(n_docs, shards)
    groups = []
    for index in range(shards):
        start = div * index + min(index, mod)
        end = start + div + (index < mod)
        groups.extend(range(s, min(s + batch, end)) for s in range(start, end, batch))
    return groups


class TokenRows(Dataset):
    """Rows of tokens as a dataset of ``{"tokens": row}``; ``rows["tokens"]`` is the whole tensor."""

    def __init__(self, tokens: Tensor):
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index):
        if isinstance(index, str):
            if index != "tokens":
                raise KeyError(f"TokenRows has one column, 'tokens', not {index!r}")
            return self.tokens
        return {"tokens": self.tokens[index]}


def pack_texts(texts, tokenizer, max_length: int = 1024, add_bos_token: bool = True,
               num_proc: Optional[int] = None) -> TokenRows:
    """A list of documents packed group by group, as TransformerLens would pack the same list as a
    ``datasets.Dataset`` with this ``num_proc``."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}")
    _seq_len(tokenizer, max_length, add_bos_token)
    parts = [pack_documents([texts[i] for i in group], tokenizer, max_length, add_bos_token)
             for group in document_groups(len(texts), num_proc)]
    return TokenRows(torch.cat(parts) if parts else torch.zeros((0, max_length), dtype=torch.long))


def pack_hf_dataset(dataset, tokenizer, max_length: int = 1024, column_name: str = "text",
                    add_bos_token: bool = True, num_proc: Optional[int] = None, streaming: bool = False,
                    set_format: bool = True):
    """A ``datasets`` Dataset (or IterableDataset) -> one of one column "tokens", torch-formatted."""
    _seq_len(tokenizer, max_length, add_bos_token)
    dataset = keep_column(dataset, column_name)

    def pack(batch):
        return {"tokens": pack_documents(batch[column_name], tokenizer, max_length, add_bos_token).numpy()}

    options = {} if streaming else {"num_proc": num_proc}
    packed = dataset.map(pack, batched=True, remove_columns=[column_name], **options)
    if set_format:
        packed.set_format(type="torch", columns=["tokens"])
    return packed


def read_texts(texts_or_file: Union[str, Path, Sequence[str]]) -> List[str]:
    """A list of documents: the list itself, or a text file's lines-separated-by-blank-lines paragraphs
    (a file with no blank line is one document per line)."""
    if isinstance(texts_or_file, (list, tuple)):
        return list(texts_or_file)
    path = Path(texts_or_file)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {str(path)!r} (give a list of strings or a text file)")
    text = path.read_text(encoding="utf-8")
    docs = [d.strip("\n") for d in text.split("\n\n")] if "\n\n" in text else text.splitlines()
    return [d for d in docs if d.strip()]


def text_data_loader(texts_or_file, tokenizer, batch_size: int = 8, max_length: int = 1024,
                     shuffle: bool = True, drop_last: bool = True, add_bos_token: bool = True,
                     generator: Optional[torch.Generator] = None) -> DataLoader:
    """Batches ``{"tokens": [batch max_length]}`` of local text packed as ``pack_texts`` packs it."""
    rows = pack_texts(read_texts(texts_or_file), tokenizer, max_length, add_bos_token)
    if len(rows) < batch_size and drop_last:
        raise ValueError(f"the text packs into {len(rows)} rows of {max_length} tokens, fewer than one batch of "
                         f"{batch_size}: give more text, a smaller max_length or batch_size")
    return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, generator=generator)


def cached_hf_dataset(name: str, config: Optional[str] = None, split: str = "train", **kwargs):
    """A dataset from the local Hugging Face datasets cache, never downloaded; a clear error otherwise.

    ``kwargs`` go to ``datasets.load_dataset`` (``data_dir``, ``cache_dir``...)."""
    how = ("supply local text instead (glassbox.train.datasets.text_data_loader(texts_or_file, tokenizer), "
           "or glassbox.tl.evals.make_text_data_loader), or run datasets.load_dataset("
           f"{name!r}{', ' + repr(config) if config else ''}, split={split!r}) where there is network so "
           "it is cached")
    try:
        import datasets
    except ImportError:
        raise ImportError(f"reading the {name!r} dataset needs the optional 'datasets' package "
                          f"(pip install datasets); or {how}") from None
    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True  # read the cache only, whatever the environment says
    try:
        return datasets.load_dataset(name, config, split=split, **kwargs)
    except Exception as error:  # datasets raises several kinds for "not cached"
        cache = os.environ.get("HF_DATASETS_CACHE", str(datasets.config.HF_DATASETS_CACHE))
        raise FileNotFoundError(f"dataset {name!r}{' (' + config + ')' if config else ''} split {split!r} is not "
                                f"in the local Hugging Face datasets cache ({cache}) and glassbox does not "
                                f"download: {how}. ({type(error).__name__}: {str(error)[:200]})") from None
    finally:
        datasets.config.HF_HUB_OFFLINE = saved


def keep_column(dataset, name: str):
    """A ``datasets`` Dataset with every column but ``name`` removed (a stream without a schema as it is)."""
    if dataset.column_names is None:
        return dataset
    if name not in dataset.column_names:
        raise KeyError(f"the dataset has no column {name!r}; its columns: {dataset.column_names}")
    return dataset.remove_columns([c for c in dataset.column_names if c != name])
