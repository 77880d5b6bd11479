"""Tokenization with one BOS policy, shared by everything that turns text into tokens.

BOS policy: ``prepend_bos`` defaults to ``cfg.default_prepend_bos`` (True for GPT-2, as in
TransformerLens: GPT-2 puts much of its attention on the first token, so a prompt reads more like
training text with the BOS in front). Pass ``prepend_bos=False`` to tokenize exactly as
``transformers`` does. Every method here (and ``forward`` on strings) applies the same rule.

Lists of strings become a padded batch plus an attention mask; GPT-2's pad, BOS and EOS are one id,
so the mask, never the token ids, says which positions are padding. Text is not truncated unless
asked (``truncate=True``): an input longer than n_ctx is an error.

``prepend_bos`` is True, False or None (the default): anything else, such as the string "False"
(which is truthy), is a TypeError naming the value; ``padding_side`` is "left", "right" or None
(the tokenizer's ``padding_side``, TransformerLens's default).

``to_str_tokens``, ``to_string``, ``get_token_position`` and ``to_single_str_token`` take the inputs
TransformerLens's methods of those names take and return the same shapes (see each docstring);
decoding never cleans up spaces, so the pieces of a text join back to it. A numpy array of ids reads
as the tensor of the same shape. Where TransformerLens asserts (a token not in the prompt, a string
that is not one token), the error is a ``TokenInputError``: a ValueError and an AssertionError.
"""

import functools
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from .inputs import check_flag, check_padding_side

GPT2_TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "assets" / "gpt2-tokenizer"
GPT2_VOCAB_SIZE = 50257

TextInput = Union[str, list]


@functools.lru_cache(maxsize=1)
def encode_text(tokenizer, text: str, what: str = "text") -> list:
    """``tokenizer.encode(text)`` without special tokens, for text that is valid Unicode: a lone
    surrogate ("\\ud800", from a bad decode or a JSON escape) is a ValueError naming ``what``, the
    position and the code point, instead of the tokenizer's TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} {_short(text)} holds a lone surrogate {text[err.start]!r} at index {err.start} "
                         "(half of a UTF-16 pair): it is not valid Unicode text, so no tokenizer can read it; "
                         "decode the text with errors='replace' or remove the character") from None
    return tokenizer.encode(text, add_special_tokens=False)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def gpt2_tokenizer():
    """GPT-2's byte-level BPE tokenizer, from the files shipped inside this package."""
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(str(GPT2_TOKENIZER_DIR))


def tokenizer_copy(tokenizer):
    """A copy of a Hugging Face tokenizer whose settings (``padding_side``, special tokens) change without
    changing the original's; the vocabulary and the compiled backend are shared, so it is cheap (a deep
    copy of GPT-2's takes most of a second). Other objects are deep-copied."""
    import copy

    if not hasattr(tokenizer, "_special_tokens_map"):
        return copy.deepcopy(tokenizer)
    own = copy.copy(tokenizer)
    own.__dict__.update({k: copy.copy(v) for k, v in tokenizer.__dict__.items() if isinstance(v, (dict, list, set))})
    return own


class TokenizerMixin:
    """Text <-> token methods for a model with ``cfg`` and an optional ``_tokenizer``."""

    @property
    def tokenizer(self):
        if self._tokenizer is None and self.cfg.d_vocab == GPT2_VOCAB_SIZE:
            self._tokenizer = gpt2_tokenizer()
        if self._tokenizer is None:
            raise ValueError(
                f"this model (d_vocab={self.cfg.d_vocab}) has no tokenizer; pass tokenizer= when "
                "building it, or give token ids instead of text"
            )
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    @property
    def bos_token_id(self) -> int:
        tok = self.tokenizer
        bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        if bos is None:
            raise ValueError("the tokenizer has neither a BOS nor an EOS token to prepend")
        return bos

    def tokenize(
        self, input: TextInput, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = "right",
        truncate: Optional[bool] = None,
    ) -> tuple:
        """Text or list of texts -> (tokens [batch pos], attention_mask [batch pos] bool or None).

        The mask is None when every row has the same length (nothing is padded). ``truncate`` says
        what happens to a text longer than n_ctx: None (the default) refuses it; True keeps each
        row's first n_ctx tokens (BOS included), as TransformerLens's ``to_tokens`` does by default;
        False keeps every token, as TransformerLens's ``to_tokens(truncate=False)`` does, for callers
        that cut the rows themselves (the forward pass still refuses more than n_ctx positions).
        """
        padding_side = self.resolve_padding_side(padding_side)
        check_flag("truncate", truncate, optional=True)
        texts = [input] if isinstance(input, str) else input
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text input must be a string or a non-empty list of strings")
        bos = self._prepend_bos(prepend_bos)
        rows = [encode_text(self.tokenizer, t, f"text {i}" if len(texts) > 1 else "text") for i, t in enumerate(texts)]
        if bos:
            rows = [[self.bos_token_id] + row for row in rows]
        if truncate:
            rows = [row[: self.cfg.n_ctx] for row in rows]
        for text, row in zip(texts, rows):
            if not row:
                raise ValueError(f"text {text!r} tokenizes to no tokens")
            if truncate is None and len(row) > self.cfg.n_ctx:
                raise ValueError(
                    f"text tokenizes to {len(row)} tokens, longer than n_ctx={self.cfg.n_ctx}: {text[:60]!r}..."
                )
        width = max(len(row) for row in rows)
        pad = self.pad_token_id
        tokens = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, row in enumerate(rows):
            span = slice(0, len(row)) if padding_side == "right" else slice(width - len(row), width)
            tokens[i, span] = torch.tensor(row, dtype=torch.long)
            mask[i, span] = True
        device = self.cfg_device()
        return tokens.to(device), (None if bool(mask.all()) else mask.to(device))

    def to_tokens(self, input: TextInput, prepend_bos: Optional[bool] = None,
                  padding_side: Optional[str] = "right", move_to_device: bool = True,
                  truncate: Optional[bool] = None) -> Int[Tensor, "batch pos"]:
        """Token ids [batch pos]; pads (if any) use ``pad_token_id``. Use ``tokenize`` for the mask.

        ``move_to_device=False`` leaves them on the CPU; ``truncate`` as in ``tokenize`` (None by
        default here: TransformerLens truncates silently, glassbox refuses unless told which).
        """
        check_flag("move_to_device", move_to_device)
        tokens = self.tokenize(input, prepend_bos, padding_side, truncate)[0]
        return tokens if move_to_device else tokens.cpu()

    def to_str_tokens(self, input, prepend_bos: Optional[bool] = None,
                      padding_side: Optional[str] = "right") -> list:
        """One string per token, with TransformerLens's shapes.

        - a string: its tokens (BOS by the BOS policy), a flat list;
        - a tensor or numpy array of ids whose shape squeezes to at most one axis ([pos], [1 pos],
          [pos 1], [1 1 pos], a 0-d id): a flat list;
        - a list: a list of strings, tensors or arrays gives one list per element (a list of lists);
          a list of ints (which TransformerLens refuses) is one sequence, a flat list; [] gives [].
        Each id is decoded alone, without clean-up of spaces, so the pieces join to the text.
        """
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side)[0].tolist()
        elif isinstance(input, (Tensor, np.ndarray)):
            ids = self._flat_ids(input, "to_str_tokens")
        elif isinstance(input, (list, tuple)):
            if all(_is_id(x) for x in input):
                ids = self._checked_ids([int(x) for x in input], "to_str_tokens")
            elif all(isinstance(x, (str, Tensor, np.ndarray, list, tuple)) for x in input):
                return [self.to_str_tokens(x, prepend_bos, padding_side) for x in input]
            else:
                raise ValueError("to_str_tokens takes a list of ids, or a list of strings or id sequences, "
                                 f"got a list of {sorted({type(x).__name__ for x in input})}")
        else:
            raise ValueError(f"to_str_tokens takes a string, a list, or a tensor or numpy array of ids, "
                             f"got {type(input).__name__}")
        return self.tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)

    def to_string(self, tokens) -> Union[str, list]:
        """Decode ids without clean-up of spaces: an int, a list of ids or a tensor/array of rank 0 or
        1 -> str; a rank-2 batch (or a list of equal-length lists) -> list of str."""
        if _is_id(tokens):
            tokens = [int(tokens)]
        ids = _as_id_tensor(tokens, "to_string")
        if ids.ndim > 2:
            raise ValueError(f"to_string takes ids of rank 0, 1 or 2, got shape {tuple(ids.shape)}")
        self._checked_ids(ids.flatten().tolist(), "to_string")
        if ids.ndim == 2:
            return self.tokenizer.batch_decode(ids.tolist(), clean_up_tokenization_spaces=False)
        return self.tokenizer.decode(ids.reshape(-1).tolist(), clean_up_tokenization_spaces=False)

    def to_single_token(self, text: str) -> int:
        """The id of a string that is exactly one token (no BOS); an error otherwise."""
        if not isinstance(text, str):
            raise TypeError(f"to_single_token takes a string, got {type(text).__name__}")
        ids = encode_text(self.tokenizer, text)
        if len(ids) != 1:
            raise TokenInputError(f"{text!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id."""
        if not _is_id(int_token):
            raise TypeError(f"to_single_str_token takes one int token id, got {int_token!r}")
        return self.to_str_tokens([int(int_token)])[0]

    def get_token_position(self, single_token, input, mode: str = "first", prepend_bos: Optional[bool] = None,
                           padding_side: Optional[str] = "right") -> int:
        """Index of ``single_token`` (an id, a one-element tensor, or a string that is one token) in
        ``input`` (a string, tokenized by the BOS policy, or one sequence of ids: [pos] or [1 pos]);
        ``mode`` "first" or "last" picks among several. Absent: ``TokenInputError``."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', not {mode!r}")
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos, padding_side)
        else:
            tokens = _as_id_tensor(input, "get_token_position", float_ids=True)
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise TokenInputError(f"get_token_position searches one sequence: rank-2 tokens must have "
                                      f"shape [1 pos], not {tuple(tokens.shape)}")
            tokens = tokens[0]
        if tokens.ndim != 1:
            raise TokenInputError(f"get_token_position takes tokens [pos] or [1 pos], got {tuple(tokens.shape)}")
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, (Tensor, np.ndarray)):
            count = single_token.size if isinstance(single_token, np.ndarray) else single_token.numel()
            if count != 1:
                raise TokenInputError(f"single_token must be one id, got a tensor of shape {tuple(single_token.shape)}")
            single_token = single_token.item()
        if not _is_id(single_token):
            raise TypeError(f"single_token must be a token id, a one-element tensor or a string, got {single_token!r}")
        where = (tokens == int(single_token)).nonzero()[:, 0]
        if where.numel() == 0:
            raise TokenInputError(f"token {int(single_token)} does not occur in the prompt (of {tokens.shape[0]} tokens)")
        return int(where[0] if mode == "first" else where[-1])

    def resolve_padding_side(self, padding_side: Optional[str]) -> str:
        """``padding_side`` checked; None means the tokenizer's (TransformerLens's default), else "right"."""
        if padding_side is None:
            tok = self._tokenizer
            padding_side = getattr(tok, "padding_side", "right") if tok is not None else "right"
        check_padding_side(padding_side)
        return padding_side

    def _flat_ids(self, ids, what: str) -> list:
        """The ids of a tensor/array whose shape squeezes to at most one axis, as a list of ints."""
        ids = _as_id_tensor(ids, what)
        flat = ids.squeeze()
        if flat.ndim > 1:
            raise ValueError(f"{what} takes one sequence of ids ([pos], [1 pos] or any shape with one axis "
                             f"over 1), got shape {tuple(ids.shape)}")
        return self._checked_ids(flat.reshape(-1).tolist(), what)

    def _checked_ids(self, ids: list, what: str) -> list:
        size = len(self.tokenizer)
        for i in ids:
            if not 0 <= i < size:
                raise ValueError(f"{what}: token id {i} is outside the tokenizer's [0, {size})")
        return ids

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else self.bos_token_id

    def _prepend_bos(self, prepend_bos: Optional[bool]) -> bool:
        check_flag("prepend_bos", prepend_bos, optional=True)
        return self.cfg.default_prepend_bos if prepend_bos is None else bool(prepend_bos)

    def cfg_device(self) -> torch.device:
        return next(self.parameters()).device


class TokenInputError(ValueError, AssertionError):
    """A token that is not there, or tokens of the wrong kind. Both a ValueError and an
    AssertionError: TransformerLens asserts in these cases, so code catching either still works."""


def _is_id(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _as_id_tensor(ids, what: str, float_ids: bool = False) -> Tensor:
    """An integer tensor (CPU or not) from a tensor, numpy array or (nested) list of ids; with
    ``float_ids`` a floating tensor of whole numbers too (``_float_ids_as_integers``)."""
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(np.ascontiguousarray(ids))
    elif isinstance(ids, (list, tuple)):
        if not len(ids):
            return torch.zeros(0, dtype=torch.long)
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{what} takes ids as a rectangular list of ints: {err}") from None
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"{what} takes ids as a rectangular list of ints, got values of dtype {array.dtype}")
        ids = torch.from_numpy(np.ascontiguousarray(array))
    if not isinstance(ids, Tensor):
        raise ValueError(f"{what} takes token ids (an int, a list, a tensor or a numpy array), got {type(ids).__name__}")
    if float_ids and ids.dtype.is_floating_point:
        return _float_ids_as_integers(ids, what)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{what} takes integer token ids, got dtype {ids.dtype}")
    return ids


def _float_ids_as_integers(ids: Tensor, what: str) -> Tensor:
    """int64 ids from a floating tensor holding whole numbers (``torch.tensor([2.0, 3, 4])``, which
    TransformerLens's tests pass). Refused: a fraction, nan or inf, and values beyond the dtype's
    exact integers (2**24 for float32), which may have been rounded when they were stored."""
    exact = int(2 / torch.finfo(ids.dtype).eps)  # 2**(mantissa bits + 1): every integer up to it is exact
    bad = ~torch.isfinite(ids) | (ids != ids.round()) | (ids.abs() > exact)
    if bool(bad.any()):
        raise ValueError(f"{what} takes token ids; a {ids.dtype} tensor must hold whole numbers up to {exact} "
                         f"(exactly stored), got {ids[bad].flatten()[0].item()!r}")
    return ids.to(torch.int64)
