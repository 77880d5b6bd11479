"""Key-value cache for incremental decoding.

Each layer keeps the keys and values of every position seen so far ([batch key_pos head d_head],
after any rotation), and the cache keeps the attention mask of those positions, so that a padded
batch keeps ignoring its pads while it generates.

A forward extends the cache layer by layer. If anything raises part-way (a hook in layer 1, an
interrupt), the forward restores the cache from ``snapshot()``: every layer's keys and values and the
mask are exactly as before the call, so the cache can be used again. Appending never writes into
the stored tensors (it concatenates into new ones), which is what makes the snapshot cheap: it holds
references, not copies.
"""

from typing import Optional

import torch
from torch import Tensor


class LayerKV:
    def __init__(self):
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None

    @property
    def length(self) -> int:
        """Positions cached so far."""
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k: Tensor, v: Tensor) -> tuple:
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=1), torch.cat([self.v, v], dim=1)
        self.k, self.v = k, v
        return k, v


class KVCache:
    def __init__(self, n_layers: int):
        self.layers = [LayerKV() for _ in range(n_layers)]
        self.key_mask: Optional[Tensor] = None  # [batch key_pos] bool, None while all tokens are real

    def __len__(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.shape[1]

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]

    def snapshot(self) -> tuple:
        """The current state, by reference (appending builds new tensors, so nothing here changes)."""
        return tuple((layer.k, layer.v) for layer in self.layers), self.key_mask

    def restore(self, snapshot: tuple) -> None:
        layers, self.key_mask = snapshot
        for layer, (k, v) in zip(self.layers, layers):
            layer.k, layer.v = k, v

    def extend_mask(self, new_mask: Optional[Tensor], new_shape: torch.Size) -> Optional[Tensor]:
        """The padding mask over all keys once new tokens (with ``new_mask``) join; remembered."""
        if self.key_mask is None and new_mask is None:
            return None
        batch, new = new_shape
        device = (new_mask if new_mask is not None else self.key_mask).device
        old = self.key_mask if self.key_mask is not None else torch.ones(batch, len(self), dtype=torch.bool, device=device)
        new_mask = new_mask if new_mask is not None else torch.ones(batch, new, dtype=torch.bool, device=device)
        self.key_mask = torch.cat([old, new_mask.bool()], dim=1)
        return self.key_mask
