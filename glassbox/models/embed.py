"""Token and learned position embeddings, and the unembedding.

W_E [d_vocab d_model] and W_pos [n_ctx d_model] are row-indexed; W_U [d_model d_vocab]
right-multiplies. With ``cfg.tied_unembed`` (GPT-2's choice) W_U is a view of W_E's transpose and
not a parameter of its own, so the two can never drift apart. The unembedding's ``hook_in``
[batch pos d_model] is what it reads (the final norm's output) and ``hook_out`` [batch pos d_vocab] the
logits, as in TransformerLens.

Gemma's options: ``cfg.scale_embed`` multiplies the token embedding by sqrt(d_model), the factor
rounded to the model's dtype first (as transformers does); ``hook_embed`` sees the scaled value. With
``cfg.output_logits_soft_cap`` the unembedding's ``hook_pre_cap`` holds x @ W_U + b_U and ``hook_out``
the capped logits cap * tanh(that / cap) (TransformerLens hooks the uncapped value only).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .masks import positions_for


class Embed(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.scale = cfg.d_model ** 0.5 if cfg.scale_embed else None

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        embedded = F.embedding(tokens, self.W_E)
        if self.scale is None:
            return embedded
        return embedded * torch.tensor(self.scale, dtype=embedded.dtype)


class PosEmbed(nn.Module):
    """W_pos [n_ctx d_model] looked up at position ids. The model calls ``lookup`` (so a subclass may
    give ``forward`` another signature, as glassbox.tl's does); ``for_tokens`` computes the ids."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.lookup(positions)

    def lookup(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return F.embedding(positions, self.W_pos)

    def for_tokens(self, tokens: Int[Tensor, "batch pos"], past: int = 0,
                   key_mask: Optional[Tensor] = None) -> Float[Tensor, "batch pos d_model"]:
        """The position embedding the model's forward adds to ``tokens`` after ``past`` cached
        positions: W_pos[past + index], or with ``key_mask`` (bool or 0/1 [batch past+pos], True for
        real tokens) W_pos[real tokens before it] (a pad gets its last real token's, or 0's, row)."""
        positions = positions_for(tokens, None if key_mask is None else key_mask.bool(), past)
        return self.lookup(positions)


class Unembed(nn.Module):
    def __init__(self, cfg: Config, embed: Optional[Embed] = None):
        super().__init__()
        if cfg.tied_unembed:
            if embed is None:
                raise ValueError("a tied unembedding needs the Embed module whose W_E it shares")
            # A plain list keeps the shared module out of this module's children and state dict.
            self._tied_to = [embed]
        else:
            self._tied_to = []
            # Stored as [d_vocab d_model] memory (F.linear's weight layout); W_U is its transpose view.
            self.W_U_T = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab)) if cfg.unembed_bias else None
        self.soft_cap = cfg.output_logits_soft_cap
        self.hook_in = HookPoint()
        if self.soft_cap is not None:
            self.hook_pre_cap = HookPoint()
        self.hook_out = HookPoint()

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self._weight().T

    def _weight(self) -> Tensor:
        return self._tied_to[0].W_E if self._tied_to else self.W_U_T

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        logits = F.linear(self.hook_in(x), self._weight(), self.b_U)
        if self.soft_cap is not None:
            logits = torch.tanh(self.hook_pre_cap(logits) / self.soft_cap) * self.soft_cap
        return self.hook_out(logits)
