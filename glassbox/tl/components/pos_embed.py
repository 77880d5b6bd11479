"""TransformerLens's ``PosEmbed``: ``forward(tokens, past_kv_pos_offset=0, attention_mask=None)``.

glassbox's ``PosEmbed.for_tokens`` computes the embedding; TransformerLens's one choice on top is that
a pad's row is 0. ``attention_mask`` covers the cached and the new positions [batch offset+pos] (what
``HookedTransformerKeyValueCache.append_attention_mask`` returns), 1/True for real tokens.
glassbox.tl's HookedTransformer gives its learned position embedding this class (the model itself
calls ``lookup``, so its forward is unchanged).
"""

import torch
from torch import Tensor

from ...models import PosEmbed as _PosEmbed
from ...models import inputs


class PosEmbed(_PosEmbed):
    def forward(self, tokens, past_kv_pos_offset=0, attention_mask=None) -> Tensor:  # checked here, not annotated
        tokens = inputs.as_tokens(inputs.as_array_tensor(tokens, "tokens"), self.W_pos.device)
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool or tokens.ndim != 2:
            raise ValueError(f"token ids must be an integer [batch pos] tensor, got {tokens.dtype} {tuple(tokens.shape)}")
        offset = past_kv_pos_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"past_kv_pos_offset must be an int >= 0, got {offset!r}")
        batch, pos = tokens.shape
        n_ctx = self.W_pos.shape[0]
        if offset + pos > n_ctx:
            raise ValueError(f"past_kv_pos_offset={offset} and {pos} tokens exceed n_ctx={n_ctx}")
        if attention_mask is None:
            return self.for_tokens(tokens, offset)
        mask = inputs.as_mask(attention_mask, (batch, offset + pos), self.W_pos.device,
                              f"past_kv_pos_offset={offset} and tokens [batch pos] make")
        embedded = self.for_tokens(tokens, offset, mask)
        return torch.where(mask[:, offset:, None], embedded, torch.zeros((), dtype=embedded.dtype,
                                                                          device=embedded.device))


__all__ = ["PosEmbed"]
