"""Readout: from the residual stream leaving the last block to one metric value per variant and prompt.

A ``PositionMetric`` reads one position per prompt, so only that position's residual stream is kept
from each pass; the kept rows are unembedded together once they would fill the memory budget (and
at the end), so the unembedding matrix is read once for many passes. Any other metric is given
full logits [batch pos d_vocab], a budget's worth of rows at a time; so is a ``PositionMetric`` with
``full=True`` (user hooks on the final norm or unembedding must see every position, see
``user_hooks.py``). A ``VariantMetric`` is given each variant's logits as ``LazyLogits``
(``lazy_logits.py``): full logits, unembedded only at the positions its function looks at. The
first variant's call says which positions those are; the rest of that pass's variants get them
unembedded together, a budget's worth at a time, before their calls (a call that looks elsewhere
gets those positions computed then and there; later blocks unembed them too). It gives one value
per variant, kept as [variant 1]; with ``full=True`` it is given plain full logits.

Values go into one tensor on the model's device, indexed by variant; nothing here waits on it.
"""

from typing import Callable

import torch
from torch import Tensor

from .lazy_logits import LazyLogits
from .metrics import PositionMetric, VariantMetric
from .runner import BaseRun, full_logits, read_resid, unembed


class Readout:
    def __init__(self, model, base: BaseRun, metric: Callable, read_pos, n_variants: int, memory_budget: int,
                 full: bool = False):
        self.model, self.base, self.metric, self.read_pos = model, base, metric, read_pos
        self.shortcut = isinstance(metric, PositionMetric) and not full
        self.per_variant = isinstance(metric, VariantMetric)
        self.lazy = self.per_variant and not full
        self.reads = None  # positions the VariantMetric looked at so far (None: not called yet)
        self.budget = memory_budget
        self.n_variants, self.n_prompts = n_variants, base.n_prompts
        self.out = None
        self.pending: list = []
        self.pending_rows = 0
        logits_row = 2 * 4 * model.cfg.d_vocab  # float32 logits and their log-softmax
        whole = max(1, memory_budget // (logits_row * self.n_prompts))
        self.rows_per_unembed = whole * self.n_prompts  # whole copies of the prompts, for tiling
        self.variants_per_full = max(1, memory_budget // (logits_row * base.seq_len * self.n_prompts))

    def add(self, final: Tensor, first: int, ids: Tensor) -> None:
        """``final`` [variant*prompt pos-first d_model] of the variants ``ids`` (device tensor), in order."""
        if self.shortcut:
            rows = read_resid(self.base, final, first, self.read_pos.repeat(ids.shape[0]))
            self.pending.append((rows, ids))
            self.pending_rows += rows.shape[0]
            if self.pending_rows >= self.rows_per_unembed:
                self.flush()
            return
        if self.lazy:
            return self.add_lazy(final, first, ids)
        P = self.n_prompts
        for lo in range(0, ids.shape[0], self.variants_per_full):
            hi = min(ids.shape[0], lo + self.variants_per_full)
            logits = full_logits(self.model, self.base, final[lo * P: hi * P], first, hi - lo)
            if self.per_variant:
                self.store_variants(self.metric.values(logits, P), ids[lo:hi])
            else:
                self.store(self.metric(logits), ids[lo:hi])

    def add_lazy(self, final: Tensor, first: int, ids: Tensor) -> None:
        """Each variant's metric on ``LazyLogits``, the positions it reads unembedded per block of variants."""
        P, S, lo = self.n_prompts, self.base.seq_len, 0
        while lo < ids.shape[0]:
            if self.reads is None:  # the first call, alone, says what the metric reads; guess the last position
                reads, hi = [S - 1], lo + 1
            else:
                reads = sorted(self.reads)
                per_variant = 2 * 4 * self.model.cfg.d_vocab * P * max(1, len(reads))
                hi = min(ids.shape[0], lo + max(1, self.budget // per_variant))
            block = final[lo * P: hi * P]
            known = self.logits_at(block, first, reads)  # [rows len(reads) d_vocab]
            where = torch.tensor(reads, dtype=torch.long, device=known.device)
            values = []
            for v in range(hi - lo):
                buffer = torch.empty((P, S) + known.shape[2:], dtype=known.dtype, device=known.device)
                buffer[:, where] = known[v * P: (v + 1) * P]
                rows = block[v * P: (v + 1) * P]
                logits = LazyLogits.make(buffer, lambda positions, rows=rows: self.logits_at(rows, first, positions),
                                         reads)
                values.append(self.metric.value_of(self.metric.fn(logits), known.device))
                self.reads = set(self.reads or ()) | logits.filled
            self.store_variants(VariantMetric.stack(values), ids[lo:hi])
            lo = hi

    def logits_at(self, rows: Tensor, first: int, positions: list) -> Tensor:
        """Logits [row len(positions) d_vocab] of ``rows`` (leaving the last block over positions
        first:) at absolute ``positions``; positions before ``first`` are the corrupted run's."""
        n = rows.shape[0] // self.n_prompts
        parts = [rows[:, p - first] if p >= first else self.base.final[:, p].repeat(n, 1) for p in positions]
        return unembed(self.model, torch.stack(parts, 1))

    def flush(self) -> None:
        if not self.pending:
            return
        rows = torch.cat([r for r, _ in self.pending])
        ids = torch.cat([i for _, i in self.pending])
        self.pending, self.pending_rows = [], 0
        step, P = self.rows_per_unembed, self.n_prompts
        for lo in range(0, rows.shape[0], step):
            logits = unembed(self.model, rows[lo: lo + step, None])[:, 0]
            self.store(self.metric.read(logits), ids[lo // P: (lo + step) // P])

    def store(self, values, ids: Tensor) -> None:
        rows = ids.shape[0] * self.n_prompts
        if not isinstance(values, Tensor) or values.shape != (rows,):
            shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"the metric returned {shape} for {rows} rows; it must return one value per row "
                             f"[batch] (row r is prompt r % {self.n_prompts}), not a batch mean")
        if self.out is None:
            self.out = torch.full((self.n_variants, self.n_prompts), float("nan"), dtype=values.dtype,
                                  device=values.device)
        self.out[ids] = values.view(ids.shape[0], self.n_prompts).to(self.out.dtype)

    def store_variants(self, values: Tensor, ids: Tensor) -> None:
        if self.out is None:
            self.out = torch.full((self.n_variants, 1), float("nan"), dtype=values.dtype, device=values.device)
        elif values.dtype != self.out.dtype:  # a later chunk's wider values widen the result, never cut
            self.out = self.out.to(torch.promote_types(self.out.dtype, values.dtype))
        self.out[ids] = values[:, None].to(self.out.dtype)

    def result(self) -> Tensor:
        """[variant prompt] metric values ([variant 1] for a VariantMetric), after a final flush, detached."""
        self.flush()
        return self.out.detach()
