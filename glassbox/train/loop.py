"""The training loop: AdamW, warm-up + cosine schedule, gradient clipping, held-out evaluation,
checkpoints, and a tqdm bar with the loss and tokens/s.

Determinism: with the same seed, data, config, device and thread count, a run gives the same
losses and weights bit for bit on the CPU; the model is initialised from ``seed`` and batches are
drawn from a CPU ``torch.Generator`` seeded with ``seed + 1`` whose state is checkpointed, so
stopping and resuming gives exactly the loss curve of an uninterrupted run. (On CUDA, kernels may
be non-deterministic; the data order is still the same.)

``TrainConfig`` refuses NaN and infinite hyperparameters (they would train an all-NaN model
without an error). Each step's log record is written before that step's checkpoint, so a run
killed in between has logged at least up to its checkpoint; ``glassbox train --resume`` drops the
records after the checkpoint, and the resumed log is the uninterrupted one.

Footgun: ``steps`` fixes the schedule. Resuming with a different ``steps`` changes the learning
rate from then on, so ``Trainer.resume`` keeps the checkpoint's training config.
"""

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..models import Config, HookedTransformer
from ..models.init import init_weights
from .checkpoint import STATE_FILE, CheckpointError, first_line, load_checkpoint, save_checkpoint
from .data import RepeatSpec, heldout_batches, training_batch
from .optim import lr_at, make_optimizer


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 4
    checkpoint_every: int = 0  # 0: only at the end (when a checkpoint folder is given)
    seed: int = 0
    repeat_frac: float = 0.0
    random_repeat_frac: float = 0.5
    min_repeat: int = 4
    max_copies: int = 2

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {value!r}")
        for name in ("warmup_steps", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be an int >= 0, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"TrainConfig.seed must be an int, got {self.seed!r}")
        if not self.warmup_steps <= self.steps:
            raise ValueError(f"TrainConfig.warmup_steps={self.warmup_steps} must be in [0, steps={self.steps}]")
        # A NaN or infinite value trains an all-NaN model without any error: refuse it here.
        for name, low, closed in (("lr", 0.0, False), ("grad_clip", 0.0, False), ("weight_decay", 0.0, True)):
            value = getattr(self, name)
            if not _finite(value) or not (value >= low if closed else value > low):
                raise ValueError(f"TrainConfig.{name} must be a finite number {'>=' if closed else '>'} {low:g}, "
                                 f"got {value!r}")
        for name in ("min_lr_frac", "repeat_frac", "random_repeat_frac"):
            value = getattr(self, name)
            if not _finite(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"TrainConfig.{name} must be a number in [0, 1], got {value!r}")
        self.repeat_spec  # validates the repeat fields

    @property
    def repeat_spec(self) -> RepeatSpec:
        return RepeatSpec(self.repeat_frac, self.random_repeat_frac, self.min_repeat, self.max_copies)


def _finite(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def init_model(cfg: Config, seed: int, tokenizer=None, device=None,
               dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """A freshly initialised model whose weights depend only on ``cfg`` and ``seed``."""
    model = HookedTransformer(cfg, tokenizer=tokenizer, init=False, device=device, dtype=dtype)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    init_weights(model, cfg, generator=generator)
    return model


class Trainer:
    """Trains ``model`` on ``train_stream`` (token ids) and evaluates on ``heldout_stream``."""

    def __init__(self, model: HookedTransformer, train_stream, heldout_stream, bos_id: int,
                 config: TrainConfig, checkpoint_dir=None, log: Optional[Callable] = None,
                 progress: bool = True):
        self.model, self.config = model, config
        self.train_stream, self.heldout_stream, self.bos_id = train_stream, heldout_stream, bos_id
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.log, self.progress = log, progress
        n_ctx = model.cfg.n_ctx
        if config.repeat_frac > 0 and 2 * config.min_repeat > n_ctx:
            raise ValueError(f"min_repeat={config.min_repeat} does not fit twice in the model's n_ctx={n_ctx}; "
                             "use a smaller min_repeat or repeat_frac=0")
        for name, stream in (("train_stream", train_stream), ("heldout_stream", heldout_stream)):
            if len(stream) < n_ctx:
                raise ValueError(f"{name} has {len(stream)} tokens, fewer than the model's n_ctx={n_ctx}")
        self.optimizer = make_optimizer(model, config.lr, config.weight_decay)
        self.generator = torch.Generator().manual_seed(config.seed + 1)
        self.step = 0
        self.history = {"train": [], "eval": []}  # [step, value] pairs
        self.eval_set = heldout_batches(heldout_stream, config.eval_batches, config.batch_size, n_ctx,
                                        bos_id, config.seed + 2)

    # -- the loop ----------------------------------------------------------------------------
    def run(self, until: Optional[int] = None) -> dict:
        """Train until step ``until`` (default: ``config.steps``); returns the loss history."""
        cfg, model = self.config, self.model
        until = cfg.steps if until is None else until
        if not self.step <= until <= cfg.steps:
            raise ValueError(f"until={until} must be in [current step {self.step}, steps={cfg.steps}]")
        device = next(model.parameters()).device
        tokens_per_step = cfg.batch_size * model.cfg.n_ctx
        bar = _progress(self.progress, self.step, until)
        start = time.perf_counter()
        first_step = self.step
        model.train()
        while self.step < until:
            lr = lr_at(self.step, cfg.lr, cfg.warmup_steps, cfg.steps, cfg.min_lr_frac)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            inputs, targets = training_batch(self.train_stream, cfg.batch_size, model.cfg.n_ctx, self.bos_id,
                                             model.cfg.d_vocab, cfg.repeat_spec, self.generator)
            loss = self.loss(inputs.to(device), targets.to(device))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=False)
            self.optimizer.step()
            self.step += 1
            record = {"step": self.step, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm.item()}
            self.history["train"].append([self.step, record["loss"]])
            elapsed = time.perf_counter() - start
            record["tokens_per_s"] = (self.step - first_step) * tokens_per_step / max(elapsed, 1e-9)
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                record["eval_loss"] = self.evaluate()
                self.history["eval"].append([self.step, record["eval_loss"]])
                model.train()
            # The log first: a run killed before the save completes resumes from the previous
            # checkpoint, and the resuming caller drops the log lines after it.
            if self.log is not None:
                self.log(record)
            if self.checkpoint_dir is not None and (
                    self.step == until or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)):
                self.save(self.checkpoint_dir)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
        if bar is not None:
            bar.close()
        model.eval()
        return self.history

    def loss(self, inputs, targets) -> torch.Tensor:
        logits = self.model(inputs)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean next-token loss on the fixed held-out batches."""
        self.model.eval()
        device = next(self.model.parameters()).device
        losses = [self.loss(x.to(device), y.to(device)).item() for x, y in self.eval_set]
        return sum(losses) / len(losses)

    # -- checkpoints -------------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "optimizer": self.optimizer.state_dict(),
                "data_rng": self.generator.get_state(), "history": self.history,
                "train_config": dataclasses.asdict(self.config)}

    def save(self, folder) -> Path:
        return save_checkpoint(folder, self.model, self.state())

    @classmethod
    def resume(cls, folder, train_stream, heldout_stream, bos_id: int, tokenizer=None, device=None,
               checkpoint_dir=None, log: Optional[Callable] = None, progress: bool = True) -> "Trainer":
        """A trainer continuing the checkpoint in ``folder`` (same model, optimizer, data order).

        Raises CheckpointError if the checkpoint is damaged or its parts do not fit together.
        """
        cfg, model_state, state = load_checkpoint(folder)
        model = HookedTransformer(cfg, tokenizer=tokenizer, init=False, device=device)
        try:
            model.load_state_dict(model_state, strict=True)
            config = TrainConfig(**state["train_config"])
        except (RuntimeError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint {folder} does not fit together: "
                                  f"{first_line(error)}") from error
        trainer = cls(model, train_stream, heldout_stream, bos_id, config,
                      checkpoint_dir=checkpoint_dir if checkpoint_dir is not None else folder, log=log,
                      progress=progress)
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
            trainer.generator.set_state(state["data_rng"])
            step, history = int(state["step"]), state["history"]
            if not 0 <= step <= config.steps or set(history) != {"train", "eval"}:
                raise ValueError(f"step {step} of {config.steps} with history keys {sorted(history)}")
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"damaged trainer state in {Path(folder) / STATE_FILE}: "
                                  f"{first_line(error)}") from error
        trainer.step, trainer.history = step, history
        return trainer


def _progress(enabled: bool, initial: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)
