"""TransformerLens's tokenizer conventions for glassbox.tl's HookedTransformer.

TransformerLens's model owns its tokenizer and edits it: a tokenizer without a pad token pads with eos
(and one without a BOS uses eos), and the model pads on ``tokenizer.padding_side``, which
``default_padding_side`` sets. So here: the model takes its own copy of the tokenizer it is given (or
of glassbox's shared GPT-2 tokenizer, on first use), with pad = eos where it had none, and
``default_padding_side`` reads and writes that copy's ``padding_side``; ``padding_side=None`` anywhere
means it. ``model.tokenizer.padding_side = "left"`` therefore changes how the model pads, as in
TransformerLens.

glassbox's own HookedTransformer keeps its rule: it never edits a tokenizer; pads are the pad token,
else BOS; ``padding_side=None`` is the tokenizer's own side (see ``glassbox.models.tokenize``).

Token ids given to the forward without an ``attention_mask`` are masked as TransformerLens masks them
when the model pads on the left or a key-value cache is passed (``_pads_of_ids``).

Footguns: the copy is the model's; editing the tokenizer object passed in afterwards does not reach it.
Under that rule a real token equal to the pad token (GPT-2's eos) at the start (left) or end (right) of
a row of ids counts as padding, as in TransformerLens; pass ``attention_mask`` to say otherwise.
"""

from typing import Optional

import numpy as np
from torch import Tensor

from ..models.inputs import check_padding_side
from ..models.tokenize import tokenizer_copy


class TokenizerConventions:
    """Mixin before glassbox's HookedTransformer: ``tokenizer`` and ``default_padding_side`` as above."""

    _tl_tokenizer = None  # the model's own copy, once made
    _tl_padding_side: Optional[str] = "right"

    @property
    def tokenizer(self):
        tok = super().tokenizer  # glassbox's: the one given, else the shared GPT-2 tokenizer, else an error
        return tok if tok is self._tl_tokenizer else self._adopt(tok)

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        self._tokenizer, self._tl_tokenizer = tokenizer, None

    def _adopt(self, tokenizer):
        own = tokenizer_copy(tokenizer)
        if own.pad_token is None and own.eos_token is not None:
            own.pad_token = own.eos_token
        if own.bos_token is None and own.eos_token is not None:
            own.bos_token = own.eos_token
        own.padding_side = self._tl_padding_side or getattr(tokenizer, "padding_side", None) or "right"
        self._tokenizer = self._tl_tokenizer = own
        return own

    @property
    def default_padding_side(self) -> str:
        """The side the model pads on: its tokenizer's ``padding_side``."""
        own = self._tl_tokenizer
        if own is None and self._tokenizer is not None:
            own = self.tokenizer
        return own.padding_side if own is not None else (self._tl_padding_side or "right")

    @default_padding_side.setter
    def default_padding_side(self, side: Optional[str]) -> None:
        if side is not None:
            check_padding_side(side)
        self._tl_padding_side = side
        if self._tl_tokenizer is not None and side is not None:
            self._tl_tokenizer.padding_side = side

    def resolve_padding_side(self, padding_side: Optional[str]) -> str:
        """``padding_side=None`` is the model's ``default_padding_side`` (its tokenizer's side)."""
        return super().resolve_padding_side(padding_side or self.default_padding_side)

    def _pads_of_ids(self, input, prepend_bos, padding_side, past_kv_cache) -> Optional[Tensor]:
        """TransformerLens's mask for token ids given without one, when it pads on the left or a key-value
        cache is passed: the leading (left) or trailing (right) ids equal to the tokenizer's pad token are
        padding, except a BOS that is also the pad token when ``prepend_bos`` (``utils.get_attention_mask``).
        None when every position is real, or for text (its mask comes from tokenizing it)."""
        if not isinstance(input, (Tensor, np.ndarray)):
            return None
        side = self.resolve_padding_side(padding_side)
        if side != "left" and past_kv_cache is None:
            return None  # TransformerLens: right padding needs no mask, the causal mask hides the pads
        try:
            tokenizer = self.tokenizer
        except ValueError:
            return None  # no tokenizer, so no pad token: every id is real
        from ..interp.token_masks import pad_attention_mask
        from ..models.inputs import as_tokens

        tokens = as_tokens(input, self.cfg_device())
        mask = pad_attention_mask(tokenizer, tokens, self._prepend_bos(prepend_bos), side)
        return None if bool(mask.all()) else mask
