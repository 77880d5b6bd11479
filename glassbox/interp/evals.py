"""Quick evaluations: loss on repeated random tokens (induction), IOI logit difference, mean loss.

``repeated_tokens_loss`` draws ``subseq_len`` uniform random ids in ``token_range`` per row with
``torch.randint`` on the CPU (``generator``, or torch's global one), repeats them once, optionally
overwrites the first id with BOS (overwrites, not prepends: the row stays ``2 * subseq_len`` long),
and averages the next-token loss over per-token positions ``subseq_len + 1`` onward, as
TransformerLens's ``induction_loss`` does; a model with induction heads scores far below ln(vocab).

``ioi_logit_diffs`` scores each IOI prompt at the position before the first token where the IO and S
names differ: logit(IO) - logit(S). Prompts are batched right-padded with a mask; a causal model's
logits there do not depend on the padding.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..models.transformer import lm_loss


def repeated_tokens(batch_size: int, subseq_len: int, token_range: Tuple[int, int],
                    bos_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                    device=None) -> Tensor:
    """[batch_size 2*subseq_len] ids: a random row twice over, the first id replaced by ``bos_token_id``."""
    low, high = token_range
    first = torch.randint(low, high, (batch_size, subseq_len), generator=generator).to(device)
    tokens = first.repeat(1, 2)
    if bos_token_id is not None:
        tokens[:, 0] = bos_token_id
    return tokens


def repeated_tokens_loss(model, batch_size: int = 4, subseq_len: int = 384, prepend_bos: Optional[bool] = None,
                         token_range: Tuple[int, int] = (100, 20000), bos_token_id: Optional[int] = None,
                         generator: Optional[torch.Generator] = None, device=None) -> Tensor:
    """Mean next-token loss (nats) on the second half of repeated random tokens; see the module docstring.

    ``prepend_bos`` defaults to ``model.cfg.default_prepend_bos``; the BOS id to the model's tokenizer's
    unless ``bos_token_id`` is given. ``device`` defaults to the model's.
    """
    cfg = model.cfg
    for name, value in (("batch_size", batch_size), ("subseq_len", subseq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if subseq_len < 3:
        raise ValueError(f"subseq_len={subseq_len} leaves no scored position (the loss starts at per-token "
                         "position subseq_len + 1 of 2 * subseq_len - 1); use subseq_len >= 3")
    if 2 * subseq_len > cfg.n_ctx:
        raise ValueError(f"subseq_len={subseq_len} makes rows of {2 * subseq_len} tokens, longer than the model's "
                         f"n_ctx={cfg.n_ctx}; use subseq_len <= {cfg.n_ctx // 2}")
    low, high = token_range
    if not 0 <= low < high <= cfg.d_vocab:
        raise ValueError(f"token_range={tuple(token_range)} must satisfy 0 <= low < high <= d_vocab={cfg.d_vocab}")
    bos = cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    if bos and bos_token_id is None:
        bos_token_id = model.tokenizer.bos_token_id
        if bos_token_id is None:
            raise ValueError("prepend_bos is on but the tokenizer has no BOS id; pass bos_token_id")
    if device is None:
        device = model.W_E.device
    tokens = repeated_tokens(batch_size, subseq_len, (low, high), bos_token_id if bos else None, generator, device)
    with torch.no_grad():
        logits = model(tokens, return_type="logits")
    return lm_loss(logits, tokens, per_token=True)[:, subseq_len + 1:].mean()


@dataclass(frozen=True)
class IOIScores:
    """Per-prompt logit differences logit(IO) - logit(S), in dataset order, and their summary."""

    logit_diffs: Tensor

    @property
    def mean_logit_diff(self) -> float:
        return float(self.logit_diffs.double().mean())

    @property
    def accuracy(self) -> float:
        """The fraction of prompts with logit(IO) > logit(S), as a Python fraction (count / n)."""
        return int((self.logit_diffs > 0).sum()) / len(self.logit_diffs)


def ioi_target(item: dict) -> Tuple[int, int, int]:
    """(position whose logits predict the names, IO id, S id) for one IOI item."""
    prompt, io, s = item["prompt"], item["IO"], item["S"]
    width = min(len(io), len(s))
    differ = (io[:width] != s[:width]).nonzero()
    if not len(differ):
        raise ValueError(f"IO {io.tolist()} and S {s.tolist()} share every token up to the shorter one: no "
                         "token tells them apart")
    first = int(differ[0, 0])
    return len(prompt) - len(io) + first - 1, int(io[first]), int(s[first])


def ioi_logit_diffs(model, dataset, batch_size: int = 8) -> IOIScores:
    """logit(IO) - logit(S) for every item of an IOI dataset (items as ``IOIDataset`` gives them)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if len(dataset) == 0:
        raise ValueError("the IOI dataset is empty: there is nothing to average")
    device = model.W_E.device
    diffs = []
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        width = max(len(item["prompt"]) for item in items)
        tokens = torch.zeros((len(items), width), dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.bool)
        for row, item in enumerate(items):
            tokens[row, : len(item["prompt"])] = item["prompt"]
            mask[row, : len(item["prompt"])] = True
        with torch.no_grad():
            logits = model(tokens.to(device), attention_mask=mask.to(device))
        for row, item in enumerate(items):
            at, io, s = ioi_target(item)
            diffs.append(logits[row, at, io] - logits[row, at, s])
    return IOIScores(torch.stack(diffs))


def mean_loss_over_batches(model, batches, max_batches: Optional[int] = None, device=None) -> float:
    """Mean over batches of each batch's mean next-token loss; ``batches`` yield ``{"tokens": ...}``."""
    if device is None:
        device = model.W_E.device
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            total += float(model(batch["tokens"].to(device), return_type="loss").mean())
            count += 1
            if max_batches is not None and count >= max_batches:
                break
    if count == 0:
        raise ValueError("no batches to evaluate")
    return total / count
