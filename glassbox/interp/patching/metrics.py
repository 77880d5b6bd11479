"""Patching metrics: one value per batch row, computed from the logits at one position per prompt.

Contract: a metric is ``fn(logits [batch pos d_vocab]) -> [batch]``. A sweep stacks many patched
copies of the corrupted batch of ``n_prompts`` prompts along the batch axis, variant by variant, so
row ``r`` always belongs to prompt ``r % n_prompts``. The metrics here know this: answer tokens and
read positions given per prompt ([prompt] tensors) are tiled to the rows they are called on.

A ``PositionMetric`` (every metric here) declares the one position per prompt it reads, so a sweep
unembeds only that position instead of the whole sequence; calling it on full logits gives the same
numbers. ``Normalized`` rescales any of them to ``(patched - corrupted) / (clean - corrupted)``:
1 on the clean run, 0 on the corrupted one.

Token ids (answers, targets) must lie in [0, d_vocab): a negative id is refused when the metric is
made, an id >= d_vocab when it first meets logits (a sweep checks before its first forward); both
errors name the argument and the id.

Footgun: with padded prompts the last real token is not at position -1; pass ``pos`` per prompt.

``VariantMetric`` is the other contract (TransformerLens's): ``fn(logits [prompt pos d_vocab]) ->
scalar``, one value per patched variant (often a mean over prompts), called on that variant's own
rows. A sweep given one returns those values; it has no per-prompt axis.
"""

from typing import Callable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

Ids = Union[int, Tensor]


def per_row(values: Tensor, n_rows: int, what: str) -> Tensor:
    """A scalar or a per-prompt [prompt] tensor, tiled to ``n_rows`` rows (row r -> prompt r % prompt)."""
    if values.ndim == 0:
        return values.expand(n_rows)
    if values.ndim != 1 or n_rows % values.shape[0]:
        raise ValueError(f"{what} has shape {tuple(values.shape)}; give one value, or one per prompt for "
                         f"a batch whose {n_rows} rows are whole copies of the prompts")
    return values.repeat(n_rows // values.shape[0])


def _as_ids(ids: Ids, what: str) -> Tensor:
    # Kept on the CPU: checks on it never wait for the device; device copies are memoised.
    ids = torch.as_tensor(ids).detach().cpu()
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.ndim > 1:
        raise ValueError(f"{what} must be a token id or a [prompt] tensor of ids, got {ids.dtype} "
                         f"shape {tuple(ids.shape)}")
    return ids.long()


def _as_token_ids(ids: Ids, what: str) -> Tensor:
    ids = _as_ids(ids, what)
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"{what} token id {int(ids.min())} is negative; token ids lie in [0, d_vocab)")
    return ids


class PositionMetric:
    """A metric reading the logits at one position per prompt.

    Subclasses implement ``read(logits [batch d_vocab]) -> [batch]``; or pass ``fn`` doing that.
    ``pos`` is an int (negative counts from the end) or a [prompt] tensor of positions.
    """

    name = "metric"

    def __init__(self, fn: Optional[Callable] = None, pos: Ids = -1, name: Optional[str] = None):
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.pos = _as_ids(pos, "pos")
        self._copies: dict = {}
        if name is not None:
            self.name = name

    def on(self, values: Tensor, device, dtype=None) -> Tensor:
        """``values`` (a CPU tensor held by this metric) on ``device``, copied once per device."""
        key = (id(values), str(device), dtype)
        if key not in self._copies:
            self._copies[key] = values.to(device=device, dtype=dtype or values.dtype)
        return self._copies[key]

    def token_ids(self) -> dict:
        """Argument name -> the token ids [prompt] (CPU) this metric indexes the logits with."""
        return {}

    def check_vocab(self, d_vocab: int) -> None:
        """Refuse, naming the argument and the id, any token id outside [0, d_vocab) (a CPU check)."""
        for what, ids in self.token_ids().items():
            if ids.numel() and int(ids.max()) >= d_vocab:
                raise ValueError(f"{self.name}: {what} token id {int(ids.max())} is outside [0, d_vocab={d_vocab})")

    def positions(self, n_rows: int, seq_len: int, device) -> Int[Tensor, "batch"]:
        """The absolute position read in each of ``n_rows`` rows of a ``seq_len`` sequence."""
        if bool(((self.pos < -seq_len) | (self.pos >= seq_len)).any()):
            raise ValueError(f"metric position {self.pos.tolist()} is outside a sequence of {seq_len} tokens")
        return per_row(self.on(self.pos, device), n_rows, "pos") % seq_len

    def read(self, logits: Float[Tensor, "batch d_vocab"]) -> Float[Tensor, "batch"]:
        if self.fn is None:
            raise NotImplementedError(f"{type(self).__name__} must implement read() or be given fn")
        return self.fn(logits)

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, "batch"]:
        if logits.ndim != 3:
            raise ValueError(f"{self.name} takes logits [batch pos d_vocab], got shape {tuple(logits.shape)}")
        rows = torch.arange(logits.shape[0], device=logits.device)
        return self.read(logits[rows, self.positions(logits.shape[0], logits.shape[1], logits.device)])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pos={self.pos.tolist()})"


class LogitDiff(PositionMetric):
    """logit[correct] - logit[wrong] at the read position: the IOI paper's measure."""

    name = "logit diff"

    def __init__(self, correct: Ids, wrong: Ids, pos: Ids = -1):
        super().__init__(pos=pos)
        self.correct, self.wrong = _as_token_ids(correct, "correct"), _as_token_ids(wrong, "wrong")

    def token_ids(self) -> dict:
        return {"correct": self.correct, "wrong": self.wrong}

    def read(self, logits: Float[Tensor, "batch d_vocab"]) -> Float[Tensor, "batch"]:
        self.check_vocab(logits.shape[-1])
        n, device = logits.shape[0], logits.device
        correct = per_row(self.on(self.correct, device), n, "correct")[:, None]
        wrong = per_row(self.on(self.wrong, device), n, "wrong")[:, None]
        return (logits.gather(-1, correct) - logits.gather(-1, wrong))[:, 0]


class TargetProb(PositionMetric):
    """Probability of ``target`` at the read position (softmax computed in float32 or wider)."""

    name = "probability"

    def __init__(self, target: Ids, pos: Ids = -1):
        super().__init__(pos=pos)
        self.target = _as_token_ids(target, "target")

    def token_ids(self) -> dict:
        return {"target": self.target}

    def read(self, logits: Float[Tensor, "batch d_vocab"]) -> Float[Tensor, "batch"]:
        self.check_vocab(logits.shape[-1])
        target = per_row(self.on(self.target, logits.device), logits.shape[0], "target")[:, None]
        return _log_probs(logits).gather(-1, target)[:, 0].exp()


class TargetLoss(PositionMetric):
    """Cross-entropy -log p(target) at the read position."""

    name = "loss"

    def __init__(self, target: Ids, pos: Ids = -1):
        super().__init__(pos=pos)
        self.target = _as_token_ids(target, "target")

    def token_ids(self) -> dict:
        return {"target": self.target}

    def read(self, logits: Float[Tensor, "batch d_vocab"]) -> Float[Tensor, "batch"]:
        self.check_vocab(logits.shape[-1])
        target = per_row(self.on(self.target, logits.device), logits.shape[0], "target")[:, None]
        return -_log_probs(logits).gather(-1, target)[:, 0]


class Normalized(PositionMetric):
    """(metric - corrupted) / (clean - corrupted): 1 where the clean value is restored, 0 at corrupted.

    ``clean`` and ``corrupted`` are floats (e.g. batch means, as in TransformerLens notebooks) or
    [prompt] tensors (each prompt normalised by its own values).
    """

    def __init__(self, metric: PositionMetric, clean: Union[float, Tensor], corrupted: Union[float, Tensor]):
        if not isinstance(metric, PositionMetric):
            raise TypeError(f"Normalized wraps a PositionMetric, got {type(metric).__name__}")
        super().__init__(pos=metric.pos)
        self.metric, self.name = metric, f"normalised {metric.name}"
        self.clean = torch.as_tensor(clean, dtype=torch.float64).detach()
        self.corrupted = torch.as_tensor(corrupted, dtype=torch.float64).detach()
        if bool((self.clean == self.corrupted).any()):
            raise ValueError(f"clean value {self.clean.tolist()} equals corrupted value "
                             f"{self.corrupted.tolist()}: the normalised metric is undefined")

    @classmethod
    def from_logits(cls, metric: PositionMetric, clean_logits: Tensor, corrupted_logits: Tensor,
                    per_prompt: bool = False) -> "Normalized":
        """Reference values measured on the clean and corrupted logits (their means unless per_prompt)."""
        clean, corrupted = metric(clean_logits).detach(), metric(corrupted_logits).detach()
        if not per_prompt:
            clean, corrupted = clean.mean(), corrupted.mean()
        return cls(metric, clean.cpu(), corrupted.cpu())

    def token_ids(self) -> dict:
        return self.metric.token_ids()

    def read(self, logits: Float[Tensor, "batch d_vocab"]) -> Float[Tensor, "batch"]:
        self.check_vocab(logits.shape[-1])  # named as this metric, before the wrapped one checks
        value = self.metric.read(logits)
        n, device, dtype = value.shape[0], value.device, value.dtype
        clean = per_row(self.on(self.clean, device, dtype), n, "clean")
        corrupted = per_row(self.on(self.corrupted, device, dtype), n, "corrupted")
        return (value - corrupted) / (clean - corrupted)


class VariantMetric:
    """A metric of one whole patched batch: ``fn(logits [prompt pos d_vocab]) -> scalar``.

    A sweep calls ``fn`` once per variant, on exactly the logits a one-patch-per-forward loop would
    give it (that variant's ``n_prompts`` rows), so a metric that averages over prompts, or compares
    prompts with each other, means what it means in the loop. ``fn`` may return a 0-d (or one-element)
    tensor or a Python number; the sweep's result holds those values, one per variant.

    In a sweep ``fn`` is given ``LazyLogits`` (``lazy_logits.py``): full [prompt pos d_vocab] logits
    whose positions are unembedded only where ``fn`` looks, so ``logits[:, -1]`` costs one position.
    ``fn`` runs once per variant in Python; a ``PositionMetric`` skips that.
    """

    def __init__(self, fn: Callable, name: Optional[str] = None):
        if not callable(fn):
            raise TypeError(f"VariantMetric wraps a function logits -> scalar, got {type(fn).__name__}")
        self.fn = fn
        self.name = name if name is not None else getattr(fn, "__name__", "metric")

    def values(self, logits: Float[Tensor, "batch pos d_vocab"], n_prompts: int) -> Float[Tensor, "variant"]:
        """``fn`` of each variant's rows of variant-major logits (row v * n_prompts + b): [variant]."""
        if logits.ndim != 3 or logits.shape[0] % n_prompts:
            raise ValueError(f"{self.name}: logits of shape {tuple(logits.shape)} are not whole variants of "
                             f"{n_prompts} prompts [batch pos d_vocab]")
        out = [self.value_of(self.fn(logits[v * n_prompts: (v + 1) * n_prompts]), logits.device)
               for v in range(logits.shape[0] // n_prompts)]
        return self.stack(out)

    def value_of(self, value, device) -> Tensor:
        """What ``fn`` returned for one variant, checked, as a detached 0-d tensor on ``device``."""
        if isinstance(value, (np.ndarray, np.generic)):  # TransformerLens takes .item() of anything
            array = np.asarray(value)
            if array.size != 1 or array.dtype.kind not in "iuf":
                raise TypeError(f"the metric {self.name} returned a numpy {array.dtype} of shape {array.shape}; "
                                "return one number")
            value = float(array.reshape(()))
        if isinstance(value, Tensor):
            if value.dtype == torch.bool or value.is_complex():
                raise TypeError(f"the metric {self.name} returned a {value.dtype} tensor; return a real number")
            if value.device.type == "meta":
                raise TypeError(f"the metric {self.name} returned a tensor on the meta device (no data); return "
                                "a number or a tensor holding one")
            if value.numel() != 1:
                raise ValueError(f"the metric {self.name} returned shape {tuple(value.shape)}; a "
                                 "VariantMetric returns one value for the whole batch (e.g. a mean over "
                                 "prompts)")
            value = value.reshape(()).to(device)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = torch.tensor(float(value), dtype=torch.float64, device=device)
        else:
            raise TypeError(f"the metric {self.name} returned {type(value).__name__}; return a scalar "
                            "tensor or a number")
        return value.detach()

    @staticmethod
    def stack(values: list) -> Tensor:
        """One value per variant [variant], in float32 or wider where the metric returned wider values."""
        dtype = torch.float32
        for value in values:
            dtype = torch.promote_types(dtype, value.dtype)
        return torch.stack([v.to(dtype) for v in values])

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"]):
        """The metric of one batch: ``fn(logits)`` as given."""
        return self.fn(logits)

    def __repr__(self) -> str:
        return f"VariantMetric({self.name})"


def _log_probs(logits: Tensor) -> Tensor:
    wide = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    return F.log_softmax(wide, dim=-1)
