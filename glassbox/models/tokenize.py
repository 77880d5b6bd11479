"""Tokenization with one BOS policy, shared by everything that turns text into tokens.

BOS policy: ``prepend_bos`` defaults to ``cfg.default_prepend_bos`` (True for GPT-2, as in
TransformerLens: GPT-2 puts much of its attention on the first token, so a prompt reads more like
training text with the BOS in front). Pass ``prepend_bos=False`` to tokenize exactly as
``transformers`` does. Every method here (and ``forward`` on strings) applies the same rule.

Lists of strings become a padded batch plus an attention mask; GPT-2's pad, BOS and EOS are one id,
so the mask, never the token ids, says which positions are padding. Text is never truncated: an
input longer than n_ctx is an error.

``prepend_bos`` is True, False or None (the default): anything else, such as the string "False"
(which is truthy), is a TypeError naming the value; ``padding_side`` is "left" or "right".
A numpy array of ids reads as the tensor of the same shape: ``to_str_tokens`` of a [1 pos] array
gives one flat list, like a [1 pos] tensor.
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
def gpt2_tokenizer():
    """GPT-2's byte-level BPE tokenizer, from the files shipped inside this package."""
    from transformers import GPT2TokenizerFast

    return GPT2TokenizerFast.from_pretrained(str(GPT2_TOKENIZER_DIR))


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
        self, input: TextInput, prepend_bos: Optional[bool] = None, padding_side: str = "right"
    ) -> tuple:
        """Text or list of texts -> (tokens [batch pos], attention_mask [batch pos] bool or None).

        The mask is None when every row has the same length (nothing is padded).
        """
        check_padding_side(padding_side)
        texts = [input] if isinstance(input, str) else input
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text input must be a string or a non-empty list of strings")
        bos = self._prepend_bos(prepend_bos)
        rows = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        if bos:
            rows = [[self.bos_token_id] + row for row in rows]
        for text, row in zip(texts, rows):
            if not row:
                raise ValueError(f"text {text!r} tokenizes to no tokens")
            if len(row) > self.cfg.n_ctx:
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
                  padding_side: str = "right") -> Int[Tensor, "batch pos"]:
        """Token ids [batch pos]; pads (if any) use ``pad_token_id``. Use ``tokenize`` for the mask."""
        return self.tokenize(input, prepend_bos, padding_side)[0]

    def to_str_tokens(self, input, prepend_bos: Optional[bool] = None) -> list:
        """One string per token of a text, or of a 1-D sequence of ids (a [1 pos] tensor or array too)."""
        if isinstance(input, np.ndarray):
            input = torch.from_numpy(np.ascontiguousarray(input))
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos)[0].tolist()
        elif isinstance(input, Tensor):
            if input.ndim == 2 and input.shape[0] == 1:
                input = input[0]
            if input.ndim != 1:
                raise ValueError(f"to_str_tokens takes one sequence, got a tensor of shape {tuple(input.shape)}")
            ids = input.tolist()
        else:
            ids = list(input)
        return [self.tokenizer.decode([i]) for i in ids]

    def to_string(self, tokens) -> Union[str, list]:
        """Decode ids: a 1-D sequence -> str, a 2-D batch -> list of str."""
        if isinstance(tokens, (Tensor, np.ndarray)):
            tokens = tokens.tolist()
        if tokens and isinstance(tokens[0], list):
            return [self.tokenizer.decode(row) for row in tokens]
        return self.tokenizer.decode(tokens)

    def to_single_token(self, text: str) -> int:
        """The id of a string that is exactly one token (no BOS); an error otherwise."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else self.bos_token_id

    def _prepend_bos(self, prepend_bos: Optional[bool]) -> bool:
        check_flag("prepend_bos", prepend_bos, optional=True)
        return self.cfg.default_prepend_bos if prepend_bos is None else bool(prepend_bos)

    def cfg_device(self) -> torch.device:
        return next(self.parameters()).device
