"""Training data: a text file -> one token stream -> random windows of ``n_ctx + 1`` tokens.

Each window is ``[BOS] + n_ctx stream tokens``; ``inputs = window[:, :-1]`` and
``targets = window[:, 1:]`` (the next token at every position). The BOS matches how glassbox
tokenizes prompts (``prepend_bos=True``), so a trained model sees position 0 as it will at use.

The held-out split is the LAST ``heldout_frac`` of the text, cut in one piece at a line break
(``split_text``), so no held-out window overlaps a training window and a tokenizer trained on the
training part has never seen the held-out text.

Repeated spans (``repeat_frac``): in that fraction of training windows, a span of ``L`` tokens
is written again every ``L + gap`` tokens (``copies`` times in all, uniform in [2, max_copies]; ``L``
uniform in [min_repeat, n_ctx // copies]), at a random offset and gap, so the model can only predict the copy by looking back at what followed the
same token earlier (an induction head), not from a fixed distance. With probability
``random_repeat_frac`` the span is replaced by uniformly random tokens (no EOT) first, so the copy
cannot be guessed from the language alone. Everything is drawn from the given ``torch.Generator``:
the same generator state gives the same batch.
"""

from dataclasses import dataclass
from typing import Tuple

import torch
from jaxtyping import Int
from torch import Tensor

from .tokenizer import text_chunks


@dataclass(frozen=True)
class RepeatSpec:
    """Which training windows get a repeated span, and what the span holds."""

    repeat_frac: float = 0.0
    random_repeat_frac: float = 0.5
    min_repeat: int = 4
    max_copies: int = 2

    def __post_init__(self):
        for name in ("repeat_frac", "random_repeat_frac"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"RepeatSpec.{name} must be in [0, 1], got {value!r}")
        if self.min_repeat < 1:
            raise ValueError(f"RepeatSpec.min_repeat must be >= 1, got {self.min_repeat!r}")
        if self.max_copies < 2:
            raise ValueError(f"RepeatSpec.max_copies must be >= 2, got {self.max_copies!r}")


def encode_text(text: str, tokenizer) -> Int[Tensor, "n"]:
    """The whole text as one stream of token ids (no special tokens), int64 on the CPU.

    Encoded in pieces (``tokenizer.text_chunks``), with exactly the ids of encoding it in one call.
    """
    ids = []
    for chunk in text_chunks(text):
        # verbose=False: a chunk is longer than model_max_length, which is harmless here.
        ids.extend(tokenizer.encode(chunk, add_special_tokens=False, verbose=False))
    if not ids:
        raise ValueError("the text encodes to no tokens")
    return torch.tensor(ids, dtype=torch.long)


def split_text(text: str, heldout_frac: float) -> Tuple[str, str]:
    """(train, heldout): the last ``heldout_frac`` of the characters, from the next line break on."""
    if not 0.0 < heldout_frac < 1.0:
        raise ValueError(f"heldout_frac must be in (0, 1), got {heldout_frac!r}")
    cut = text.find("\n", int(len(text) * (1.0 - heldout_frac)))
    if cut <= 0 or cut == len(text) - 1:
        raise ValueError(f"cannot cut a held-out {heldout_frac:.0%} of a {len(text)}-character text at a "
                         "line break; use a longer text with several lines")
    return text[:cut + 1], text[cut + 1:]


def unigram_loss(train_stream: Int[Tensor, "n"], heldout_stream: Int[Tensor, "m"], d_vocab: int) -> float:
    """Held-out cross-entropy (nats/token) of the training unigram frequencies, add-one smoothed.

    The baseline a language model must beat: it knows which tokens are common, not the context.
    """
    counts = torch.bincount(train_stream, minlength=d_vocab).double() + 1.0
    log_probs = counts.log() - counts.sum().log()
    return -log_probs[heldout_stream].mean().item()


def sample_windows(stream: Int[Tensor, "n"], batch_size: int, n_ctx: int, bos_id: int,
                   generator: torch.Generator) -> Int[Tensor, "batch n_ctx_plus_1"]:
    """``batch_size`` windows ``[BOS] + stream[i : i + n_ctx]`` at uniformly random starts i."""
    if len(stream) < n_ctx:
        raise ValueError(f"stream of {len(stream)} tokens is shorter than n_ctx={n_ctx}")
    starts = torch.randint(0, len(stream) - n_ctx + 1, (batch_size,), generator=generator)
    body = stream[starts[:, None] + torch.arange(n_ctx)]
    bos = torch.full((batch_size, 1), bos_id, dtype=stream.dtype)
    return torch.cat([bos, body], dim=1)


def add_repeats(windows: Int[Tensor, "batch n_ctx_plus_1"], spec: RepeatSpec, d_vocab: int, bos_id: int,
                generator: torch.Generator) -> Int[Tensor, "batch n_ctx_plus_1"]:
    """A copy of ``windows`` where a ``spec.repeat_frac`` share of rows repeat a span (see module doc)."""
    out = windows.clone()
    length = windows.shape[1] - 1  # positions 1..length hold text; position 0 keeps the BOS
    if spec.repeat_frac == 0.0:
        return out
    if 2 * spec.min_repeat > length:
        raise ValueError(f"min_repeat={spec.min_repeat} does not fit twice in n_ctx={length}")
    # A fixed number of draws per row (whether used or not), so the random numbers taken from the
    # generator never depend on the data. The copy counts are drawn only when more than two copies
    # are allowed, so two-copy recipes keep the data order they always had.
    draws = torch.rand(windows.shape[0], 5, generator=generator)
    noise = torch.randint(0, d_vocab - 1, windows.shape, generator=generator)
    noise = noise + (noise >= bos_id).long()  # never the BOS/EOT id
    copy_draws = torch.rand(windows.shape[0], generator=generator).tolist() if spec.max_copies > 2 else \
        [0.0] * windows.shape[0]
    for row, (use, use_random, u_len, u_gap, u_start) in enumerate(draws.tolist()):
        if use >= spec.repeat_frac:
            continue
        copies = 2 + int(copy_draws[row] * (spec.max_copies - 1))
        copies = min(copies, length // spec.min_repeat)
        max_span = length // copies
        span = spec.min_repeat + int(u_len * (max_span - spec.min_repeat + 1))
        gap = int(u_gap * ((length - copies * span) // (copies - 1) + 1))
        start = 1 + int(u_start * (length - copies * span - (copies - 1) * gap + 1))
        if use_random < spec.random_repeat_frac:
            out[row, start:start + span] = noise[row, :span]
        for copy in range(1, copies):
            at = start + copy * (span + gap)
            out[row, at:at + span] = out[row, start:start + span]
    return out


def training_batch(stream: Int[Tensor, "n"], batch_size: int, n_ctx: int, bos_id: int, d_vocab: int,
                   spec: RepeatSpec, generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """(inputs [batch n_ctx], targets [batch n_ctx]) for one training step."""
    windows = add_repeats(sample_windows(stream, batch_size, n_ctx, bos_id, generator), spec, d_vocab,
                          bos_id, generator)
    return windows[:, :-1], windows[:, 1:]


def heldout_batches(stream: Int[Tensor, "n"], n_batches: int, batch_size: int, n_ctx: int, bos_id: int,
                    seed: int) -> list:
    """A fixed list of held-out (inputs, targets) batches, the same for every evaluation."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        windows = sample_windows(stream, batch_size, n_ctx, bos_id, generator)
        batches.append((windows[:, :-1], windows[:, 1:]))
    return batches
