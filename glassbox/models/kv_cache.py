"""Key-value cache for incremental decoding.

Each layer keeps the keys and values of every position seen so far ([batch key_pos head d_head],
after any rotation), and the cache keeps the attention mask of those positions, so that a padded
batch keeps ignoring its pads while it generates.

A forward extends the cache layer by layer. If anything raises part-way (a hook in layer 1, an
interrupt), the forward restores the cache from ``snapshot()``: every layer's keys and values and the
mask are exactly as before the call, so the cache can be used again. Appending never writes into
the stored tensors (it concatenates into new ones), which is what makes the snapshot cheap: it holds
references, not copies.

A frozen cache (``freeze()``) is read and not extended: a forward's new tokens attend to the cached
prefix and to each other exactly as with an unfrozen cache, and afterwards the cache holds the prefix
alone, so many continuations can run against one prefix. ``unfreeze()`` makes it grow again.
Freezing is per layer (``LayerKV.frozen``) as well as for the mask; ``freeze()`` sets them all.

Footguns: a cache belongs to one model and one batch. ``check_fits`` (called by the forward before
anything runs) refuses a cache of another number of layers or another batch size, and ``LayerKV.append``
keys of another [head d_head]; ``append_mask`` outside a forward makes the mask longer than the
keys, which the next forward refuses rather than misplacing every position.
"""

from typing import Optional

import torch
from torch import Tensor


class LayerKV:
    def __init__(self):
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.frozen = False

    @property
    def length(self) -> int:
        """Positions cached so far."""
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k: Tensor, v: Tensor) -> tuple:
        """The cached and the new keys and values [batch key_pos head d_head]; stored unless frozen."""
        if self.k is not None:
            if k.shape[0] != self.k.shape[0] or k.shape[2:] != self.k.shape[2:]:
                raise ValueError(f"new keys [batch pos head d_head] {tuple(k.shape)} do not fit the cached keys "
                                 f"{tuple(self.k.shape)}: the key-value cache is of another model or batch")
            k, v = torch.cat([self.k, k], dim=1), torch.cat([self.v, v], dim=1)
        if not self.frozen:
            self.k, self.v = k, v
        return k, v


class KVCache:
    def __init__(self, n_layers: int):
        self.layers = [LayerKV() for _ in range(n_layers)]
        self.key_mask: Optional[Tensor] = None  # [batch key_pos] bool, None while all tokens are real
        self.frozen = False

    def __len__(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.shape[1]

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]

    def freeze(self) -> None:
        """Forwards read the cache and leave it as it is (every layer and the mask)."""
        self.frozen = True
        for layer in self.layers:
            layer.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False
        for layer in self.layers:
            layer.frozen = False

    def snapshot(self) -> tuple:
        """The current state, by reference (appending builds new tensors, so nothing here changes)."""
        return tuple((layer.k, layer.v) for layer in self.layers), self.key_mask

    def restore(self, snapshot: tuple) -> None:
        layers, self.key_mask = snapshot
        for layer, (k, v) in zip(self.layers, layers):
            layer.k, layer.v = k, v

    def check_fits(self, n_layers: int, batch: int) -> None:
        """ValueError unless this cache can serve a model of ``n_layers`` on a batch of ``batch`` (keys
        of another [head d_head] are refused by ``LayerKV.append``, and the forward then restores)."""
        if len(self.layers) != n_layers:
            raise ValueError(f"the key-value cache has {len(self.layers)} layers, the model {n_layers}: "
                             "it is another model's cache")
        k = self.layers[0].k
        if k is not None:
            if k.shape[0] != batch:
                raise ValueError(f"the key-value cache holds a batch of {k.shape[0]}, the input has {batch}; "
                                 "a cache serves the batch it was filled with")
        if any(layer.length != len(self) for layer in self.layers):
            raise ValueError("the key-value cache's layers hold different numbers of positions "
                             f"{[layer.length for layer in self.layers]}; was one layer frozen alone?")
        if self.key_mask is not None:
            if self.key_mask.shape != (batch, len(self)):
                raise ValueError(f"the key-value cache's attention mask is [batch key_pos] "
                                 f"{tuple(self.key_mask.shape)}, its keys cover ({batch}, {len(self)}); "
                                 "was the mask appended outside a forward?")

    def append_mask(self, new_mask: Tensor) -> Tensor:
        """The mask over cached and new positions [batch key_pos+new] (bool), ``new_mask`` [batch new]
        being 1/True for real tokens; stored unless the cache is frozen. The forward calls it."""
        if not isinstance(new_mask, Tensor) or new_mask.ndim != 2:
            raise ValueError(f"attention_mask must be a [batch new_tokens] tensor, got "
                             f"{tuple(new_mask.shape) if isinstance(new_mask, Tensor) else type(new_mask).__name__}")
        if new_mask.dtype != torch.bool:
            if new_mask.is_floating_point() or new_mask.is_complex() \
                    or not bool(((new_mask == 0) | (new_mask == 1)).all()):
                raise ValueError(f"attention_mask must hold 0/1 (or bool), got {new_mask.dtype} values "
                                 f"{new_mask.unique()[:5].tolist()}")
        batch, k = new_mask.shape[0], self.layers[0].k
        cached = self.key_mask.shape[0] if self.key_mask is not None else k.shape[0] if k is not None else batch
        if cached != batch:
            raise ValueError(f"attention_mask has a batch of {batch}, the key-value cache {cached}")
        if self.key_mask is not None:
            old = self.key_mask
        else:
            old = torch.ones(batch, len(self), dtype=torch.bool, device=new_mask.device)
        mask = torch.cat([old, new_mask.to(old.device).bool()], dim=1)
        if not self.frozen:
            self.key_mask = mask
        return mask

    def extend_mask(self, new_mask: Optional[Tensor], new_shape: torch.Size) -> Optional[Tensor]:
        """The padding mask over all keys once new tokens (with ``new_mask``) join; remembered unless
        frozen. None while every token, cached and new, is real."""
        if self.key_mask is None and new_mask is None:
            return None
        batch, new = new_shape
        if new_mask is None:
            new_mask = torch.ones(batch, new, dtype=torch.bool, device=self.key_mask.device)
        return self.append_mask(new_mask)
