"""Activations streamed from a glassbox model over a token stream, through a shuffling buffer.

The token stream (``glassbox.train.data.encode_text`` of a text) is cut into random windows
``[BOS] + (context_size - 1)`` stream tokens (``glassbox.train.data.sample_windows``), as the model
saw its training windows; the model runs on ``model_batch`` windows at a time, up to the layer of
``hook_name`` only, under ``no_grad``; the activations at ``hook_name`` are flattened to one row per
token, the rows whose token is special (BOS and the tokenizer's other structural ids, SAELens's
``exclude_special_tokens``) dropped unless ``exclude_special_tokens=False``.

The buffer: enough windows are run to hold ``buffer_batches * batch_tokens`` rows, the rows are
permuted (``torch.randperm`` on the stream's CPU generator) and served as ``buffer_batches`` batches
of ``batch_tokens`` rows; the rows left over past a whole number of batches are dropped, and the next
batch after the last one refills the buffer. So every batch mixes tokens of many windows, and every
fill starts from nothing: the stream's whole state is the generator state at the start of the
current fill plus how many batches of it were served (``state()``), and ``load_state`` rebuilds the
same buffer (the model's forward is deterministic on the CPU), so a resumed run reads the same
batches bit for bit. (SAELens's mixing buffer keeps half of each fill for the next; this one does
not, which is what keeps its state that small.)

Footguns: the model must be in eval mode and its hooks must not change the activations at or
before ``hook_name`` (an SAE spliced there would train an SAE on its own reconstruction); the
activations are cast to ``dtype`` on ``device`` (the SAE's).
"""

import re
from typing import Optional, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..data import sample_windows

SPECIAL_TOKEN_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")


def special_token_ids(tokenizer) -> list:
    """The tokenizer's structural special ids (BOS, EOS, PAD, SEP, decoder start), sorted: the tokens
    SAELens excludes with ``exclude_special_tokens=True``."""
    ids = {getattr(tokenizer, attr, None) for attr in SPECIAL_TOKEN_ATTRS}
    return sorted(i for i in ids if isinstance(i, int))


def stop_layer(hook_name: str, n_layers: int) -> Optional[int]:
    """The ``stop_at_layer`` that still runs ``hook_name``: L+1 for ``blocks.L.*``, 0 for the
    embeddings, None (the whole model) for anything after the blocks."""
    match = re.match(r"blocks\.(\d+)\.", hook_name)
    if match:
        return min(int(match.group(1)) + 1, n_layers)
    if hook_name in ("hook_embed", "hook_pos_embed"):
        return 0
    return None


class ActivationStream:
    """Batches [batch_tokens d_in] of a model's activations at ``hook_name`` (see module docstring)."""

    def __init__(self, model, tokens: Int[Tensor, "n"], hook_name: str, d_in: int, context_size: int,
                 batch_tokens: int, buffer_batches: int, model_batch: int, bos_id: int,
                 ignore_ids: Sequence[int], generator: torch.Generator, device=None,
                 dtype: torch.dtype = torch.float32):
        if hook_name not in model.hook_dict:
            from ...hooks.root import unknown_name_message

            raise KeyError(f"hook_name {hook_name!r} is not a hook of this model: "
                           + unknown_name_message(hook_name, model.hook_dict))
        if not 2 <= context_size <= model.cfg.n_ctx:
            raise ValueError(f"context_size={context_size} must be in [2, the model's n_ctx={model.cfg.n_ctx}]")
        if tokens.ndim != 1 or len(tokens) < context_size - 1:
            raise ValueError(f"the token stream has {tokens.numel()} tokens, fewer than one window of "
                             f"context_size - 1 = {context_size - 1} after the BOS")
        for name, value in (("batch_tokens", batch_tokens), ("buffer_batches", buffer_batches),
                            ("model_batch", model_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        self.model, self.tokens, self.hook_name, self.d_in = model, tokens.long().cpu(), hook_name, d_in
        self.context_size, self.batch_tokens, self.buffer_batches = context_size, batch_tokens, buffer_batches
        self.model_batch, self.bos_id, self.generator = model_batch, int(bos_id), generator
        self.ignore_ids = torch.tensor(sorted(set(int(i) for i in ignore_ids)), dtype=torch.long)
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.dtype = dtype
        self.stop = stop_layer(hook_name, model.cfg.n_layers)
        if torch.isin(self.tokens, self.ignore_ids).all():
            raise ValueError("every token of the stream is a special token, which the SAE does not train on; "
                             "give text, or exclude_special_tokens=False")
        self.buffer: Optional[Tensor] = None
        self.served = 0
        self.fill_rng: Optional[Tensor] = None

    # -- batches ----------------------------------------------------------------------------------
    def next_batch(self) -> Float[Tensor, "batch_tokens d_in"]:
        if self.buffer is None or self.served == self.buffer_batches:
            self.fill()
        start = self.served * self.batch_tokens
        self.served += 1
        return self.buffer[start:start + self.batch_tokens]

    @torch.no_grad()
    def activations(self, windows: Int[Tensor, "batch pos"]) -> Float[Tensor, "rows d_in"]:
        """The activations at the hook of the non-excluded tokens of ``windows``, one row per token."""
        model_device = next(self.model.parameters()).device
        _, cache = self.model.run_with_cache(windows.to(model_device), names_filter=self.hook_name,
                                             stop_at_layer=self.stop)
        acts = cache[self.hook_name]
        acts = acts.reshape(acts.shape[0] * acts.shape[1], -1)
        if acts.shape[-1] != self.d_in:
            raise ValueError(f"the activations at {self.hook_name} have {acts.shape[-1]} values per token; "
                             f"the SAE reads d_in={self.d_in}")
        keep = ~torch.isin(windows.reshape(-1), self.ignore_ids)
        return acts[keep.to(acts.device)].to(self.device, self.dtype)

    def fill(self) -> None:
        """Run windows until the buffer holds its batches, then permute it (see module docstring)."""
        self.fill_rng = self.generator.get_state()
        need = self.buffer_batches * self.batch_tokens
        parts, rows = [], 0
        while rows < need:
            windows = sample_windows(self.tokens, self.model_batch, self.context_size - 1, self.bos_id,
                                     self.generator)
            acts = self.activations(windows)
            parts.append(acts)
            rows += acts.shape[0]
        order = torch.randperm(rows, generator=self.generator)[:need]
        self.buffer = torch.cat(parts)[order.to(self.device)]
        self.served = 0

    # -- resuming ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """What ``load_state`` needs to rebuild the stream here: the generator state at the start of
        the current fill (or now, before the first) and the batches of it served."""
        rng = self.fill_rng if self.buffer is not None else self.generator.get_state()
        return {"fill_rng": rng.clone(), "served": self.served, "started": self.buffer is not None}

    def load_state(self, state: dict) -> None:
        self.generator.set_state(state["fill_rng"])
        if state["started"]:
            self.fill()
            served = int(state["served"])
            if not 0 <= served <= self.buffer_batches:
                raise ValueError(f"the stream's state says {served} batches of a buffer of "
                                 f"{self.buffer_batches} were served")
            self.served = served
        else:
            self.buffer, self.served, self.fill_rng = None, 0, None
