"""The SAE trainer: SAELens's recipe on activations streamed from a glassbox model.

Per step (SAELens's ``SAETrainer``): a batch of ``batch_tokens`` activations from the shuffling
buffer (``stream.py``); the losses of ``losses.py`` (TopK + AuxK, or ReLU + decoder-norm-weighted
L1 whose coefficient warms up linearly from 0 over ``l1_warmup_steps``); Adam (betas 0.9/0.999, no
weight decay), gradient-norm clipping at 1.0, the learning rate ``lr`` after a linear warm-up over
``lr_warmup_steps`` and with a linear decay to 0 over the last ``lr_decay_steps`` (both 0 by
default: SAELens's constant schedule); the dead-feature counters of ``dead.py``, and for a ReLU SAE
resampling of its dead features every ``feature_sampling_window`` steps, which is also the window of
the firing frequencies saved as SAELens's ``sparsity.safetensors`` (0: the whole run).

Initialisation (SAELens's training SAEs): decoder rows Kaiming-uniform, then scaled to norm
``decoder_init_norm`` (0.1); ``W_enc = W_dec^T``; biases zero; drawn from a CPU generator seeded by
``seed`` and copied to the device, so an SAE starts the same on every device. ``b_dec_init="mean"``
(older SAELens's option; SAELens 6 starts from zeros) sets ``b_dec`` to the mean of the first
buffer's activations before the first step, so the encoder starts on centred inputs.

Determinism: on the CPU a run is bit-for-bit repeatable for a seed and a thread count, and a run
resumed from a checkpoint continues bit-for-bit as if it had not stopped (the checkpoint holds the
SAE, Adam's state, the stream's state, the resampling generator and the dead-feature counters).
``final_sae()`` returns a copy with the decoder rows folded to norm 1 (``losses.fold_decoder_norms``).
"""

import copy
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from ...interp.sae.base import SAE, StandardSAE
from ...interp.sae.config import SAEConfig
from ..checkpoint import STATE_FILE, CheckpointError, first_line
from .checkpoint import load_sae_checkpoint, save_sae_checkpoint
from .dead import DeadFeatures, resample_dead
from .losses import batch_metrics, fold_decoder_norms, training_step_losses
from .stream import ActivationStream, special_token_ids

ARCHITECTURES = ("topk", "standard")
GRAD_CLIP = 1.0


def sae_class(architecture: str) -> type:
    if architecture == "standard":
        return StandardSAE
    if architecture == "topk":
        from ...interp.sae.architectures import TopKSAE

        return TopKSAE
    raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")


def _whole(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def _finite(name: str, value, low: float, low_open: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
        (value > low if low_open else value >= low)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if low_open else '>='} {low:g}, got {value!r}")


@dataclass(frozen=True)
class SAETrainConfig:
    """Everything that shapes an SAE training run (recorded in its checkpoint and settings)."""

    hook_name: str
    d_sae: int
    context_size: int
    architecture: str = "topk"
    k: Optional[int] = None
    l1_coefficient: float = 1.0
    l1_warmup_steps: int = 0
    aux_k_coefficient: float = 1.0
    steps: int = 1000
    batch_tokens: int = 4096
    lr: float = 3e-4
    lr_warmup_steps: int = 0
    lr_decay_steps: int = 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    seed: int = 0
    buffer_batches: int = 16
    model_batch: int = 16
    exclude_special_tokens: bool = True
    dead_feature_window: int = 1000
    feature_sampling_window: int = 2000
    decoder_init_norm: float = 0.1
    b_dec_init: str = "zeros"
    checkpoint_every: int = 0

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if not isinstance(self.hook_name, str) or not self.hook_name:
            raise ValueError(f"hook_name must name a hook point, got {self.hook_name!r}")
        for name, low in (("d_sae", 1), ("context_size", 2), ("l1_warmup_steps", 0), ("steps", 1),
                          ("batch_tokens", 1), ("lr_warmup_steps", 0), ("lr_decay_steps", 0), ("seed", 0),
                          ("buffer_batches", 1), ("model_batch", 1), ("dead_feature_window", 1),
                          ("feature_sampling_window", 0), ("checkpoint_every", 0)):
            _whole(name, getattr(self, name), low)
        if self.architecture == "topk":
            if self.k is None:
                raise ValueError("k (features kept per token) is needed for architecture='topk'")
            _whole("k", self.k, 1)
            if self.k > self.d_sae:
                raise ValueError(f"k={self.k} is more than d_sae={self.d_sae}")
        elif self.k is not None:
            raise ValueError(f"k={self.k!r} is for architecture='topk'; architecture={self.architecture!r} "
                             "uses l1_coefficient")
        for name, low, low_open in (("l1_coefficient", 0.0, False), ("aux_k_coefficient", 0.0, False),
                                    ("lr", 0.0, True), ("decoder_init_norm", 0.0, True)):
            _finite(name, getattr(self, name), low, low_open)
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.lr_warmup_steps + self.lr_decay_steps > self.steps:
            raise ValueError(f"lr_warmup_steps ({self.lr_warmup_steps}) + lr_decay_steps ({self.lr_decay_steps}) "
                             f"is more than steps ({self.steps})")
        if self.b_dec_init not in ("zeros", "mean"):
            raise ValueError(f"b_dec_init must be 'zeros' or 'mean', got {self.b_dec_init!r}")
        if not isinstance(self.exclude_special_tokens, bool):
            raise ValueError(f"exclude_special_tokens must be True or False, got {self.exclude_special_tokens!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based): a pure function of the step."""
        if step < self.lr_warmup_steps:
            return self.lr * (step + 1) / self.lr_warmup_steps
        left = self.steps - step
        if left <= self.lr_decay_steps:
            return self.lr * left / self.lr_decay_steps
        return self.lr

    def l1_at(self, step: int) -> float:
        """The L1 coefficient at step ``step``: 0 at step 0, reaching ``l1_coefficient`` after the warm-up."""
        if step < self.l1_warmup_steps:
            return self.l1_coefficient * step / self.l1_warmup_steps
        return self.l1_coefficient


def hook_width(model, hook_name: str, bos_id: int) -> tuple:
    """(d_in, reshape_activations) of the activations at ``hook_name``: one two-token forward."""
    from .stream import stop_layer

    device = next(model.parameters()).device
    tokens = torch.full((1, 2), bos_id, dtype=torch.long, device=device)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=hook_name,
                                        stop_at_layer=stop_layer(hook_name, model.cfg.n_layers))
    shape = cache[hook_name].shape
    width = math.prod(shape[2:])
    return width, ("hook_z" if hook_name.endswith("hook_z") and len(shape) == 4 else "none")


@torch.no_grad()
def initialize(sae: SAE, config: SAETrainConfig) -> None:
    """SAELens's training initialisation (module docstring), from a CPU generator seeded by ``seed``."""
    generator = torch.Generator().manual_seed(config.seed)
    W = torch.empty(sae.cfg.d_sae, sae.cfg.d_in)
    torch.nn.init.kaiming_uniform_(W, generator=generator)
    W = W / W.norm(dim=-1, keepdim=True) * config.decoder_init_norm
    sae.W_dec.copy_(W)
    sae.W_enc.copy_(W.T)
    sae.b_enc.zero_()
    sae.b_dec.zero_()


class SAETrainer:
    """Trains an SAE on ``model``'s activations at ``config.hook_name`` over ``tokens`` (1-D ids)."""

    def __init__(self, model, tokens: torch.Tensor, config: SAETrainConfig, bos_id: int, ignore_ids=None,
                 device=None, dtype: torch.dtype = torch.float32, sae: Optional[SAE] = None,
                 metadata: Optional[dict] = None, checkpoint_dir=None, log: Optional[Callable] = None,
                 progress: bool = True):
        if not isinstance(config, SAETrainConfig):
            raise TypeError(f"config must be an SAETrainConfig, got {type(config).__name__}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if config.hook_name not in model.hook_dict:
            from ...hooks.root import unknown_name_message

            raise KeyError(f"hook_name {config.hook_name!r} is not a hook of this model: "
                           + unknown_name_message(config.hook_name, model.hook_dict))
        if config.context_size > model.cfg.n_ctx:
            raise ValueError(f"context_size={config.context_size} is more than the model's n_ctx={model.cfg.n_ctx}")
        self.model, self.config = model.eval(), config
        device = torch.device(device) if device is not None else next(model.parameters()).device
        if sae is None:
            d_in, reshape = hook_width(model, config.hook_name, bos_id)
            sae_cfg = SAEConfig(architecture=config.architecture, d_in=d_in, d_sae=config.d_sae,
                                hook_name=config.hook_name, reshape_activations=reshape, k=config.k,
                                metadata=dict(metadata or {}))
            sae = sae_class(config.architecture)(sae_cfg, device=device, dtype=dtype)
            initialize(sae, config)
        if sae.cfg.reshape_activations == "hook_z":
            sae.d_head = model.cfg.d_head  # the stream's rows are [head * d_head]; encode takes [head d_head]
        self.sae = sae.train()
        if ignore_ids is None:
            ignore_ids = [bos_id]
        self.stream = ActivationStream(model, tokens, config.hook_name, sae.cfg.d_in, config.context_size,
                                       config.batch_tokens, config.buffer_batches, config.model_batch, bos_id,
                                       ignore_ids if config.exclude_special_tokens else [],
                                       torch.Generator().manual_seed(config.seed + 1), sae.device, sae.dtype)
        self.optimizer = torch.optim.Adam(sae.parameters(), lr=config.lr,
                                          betas=(config.adam_beta1, config.adam_beta2), foreach=False)
        self.resample_rng = torch.Generator().manual_seed(config.seed + 2)
        self.dead = DeadFeatures(config.d_sae, config.dead_feature_window, sae.device)
        self.step = 0
        self.history = {"train": []}  # [step, loss, mse_loss, l0, explained_variance]
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.log, self.progress = log, progress

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, until: Optional[int] = None) -> dict:
        """Train until step ``until`` (default ``config.steps``); returns the history."""
        cfg = self.config
        until = cfg.steps if until is None else until
        if not self.step <= until <= cfg.steps:
            raise ValueError(f"until={until} must be in [current step {self.step}, steps={cfg.steps}]")
        if self.step == 0 and cfg.b_dec_init == "mean" and self.stream.buffer is None:
            self.stream.fill()  # the first batches are served from this buffer
            with torch.no_grad():
                self.sae.b_dec.copy_(self.stream.buffer.mean(0))
        bar = _progress(self.progress, self.step, until)
        try:
            while self.step < until:
                record = self.train_step()
                if self.log is not None:
                    self.log(record)  # before the save: a resumed run drops the log lines past its checkpoint
                if self.checkpoint_dir is not None and (
                        self.step == until or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)):
                    self.save(self.checkpoint_dir)
                if bar is not None:
                    bar.set_postfix(L0=f"{record['l0']:.1f}", EV=f"{record['explained_variance']:.3f}",
                                    mse=f"{record['mse_loss']:.4g}", dead=record["dead_features"], refresh=False)
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self.sae.eval()
        return self.history

    def train_step(self) -> dict:
        cfg, sae = self.config, self.sae
        sae.train()
        if self.step > 0 and cfg.feature_sampling_window and self.step % cfg.feature_sampling_window == 0:
            self.dead.reset_window()  # SAELens's sparsity window: the last one is never reset
        lr = cfg.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x = self.stream.next_batch()
        out = training_step_losses(sae, x, self.dead.mask(), cfg.l1_at(self.step), cfg.aux_k_coefficient)
        loss = out["loss"].item()
        if not math.isfinite(loss):  # refused before anything is updated: the SAE stays at the last good step
            bad = "the activations hold NaN or inf" if not bool(torch.isfinite(x).all()) else \
                f"the SAE's weights or lr={lr:g} diverged"
            raise ValueError(f"SAE training step {self.step + 1}: the loss is {loss} ({bad} at {cfg.hook_name}); "
                             f"nothing was updated, and the SAE is that of step {self.step}")
        self.dead.update(out["feature_acts"])
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), GRAD_CLIP, foreach=False)
        self.optimizer.step()
        self.step += 1
        record = {"step": self.step, "lr": lr, "loss": loss, "mse_loss": out["mse_loss"].item()}
        for name in ("l1_loss", "aux_loss"):
            if name in out:
                record[name] = out[name].item()
        record.update(batch_metrics(x, out["sae_out"], out["feature_acts"]))
        if cfg.architecture == "standard" and cfg.feature_sampling_window and \
                self.step % cfg.feature_sampling_window == 0 and self.step < cfg.steps:
            dead = self.dead.mask()
            record["resampled"] = resample_dead(sae, self.optimizer, x, out["sae_out"].detach(), dead,
                                                self.resample_rng)
            self.dead.steps_since_fired[dead] = 0
        record["dead_features"] = int(self.dead.mask().sum())
        self.history["train"].append([self.step, record["loss"], record["mse_loss"], record["l0"],
                                      record["explained_variance"]])
        return record

    def log_sparsity(self) -> torch.Tensor:
        """[d_sae] log10 firing frequencies over the last sparsity window (SAELens's sparsity file)."""
        return self.dead.log_sparsity()

    def final_sae(self) -> SAE:
        """A copy of the SAE with unit decoder rows (``losses.fold_decoder_norms``), in eval mode."""
        sae = copy.deepcopy(self.sae).eval()
        fold_decoder_norms(sae)
        return sae

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "optimizer": self.optimizer.state_dict(), "stream": self.stream.state(),
                "resample_rng": self.resample_rng.get_state(),
                "steps_since_fired": self.dead.steps_since_fired.cpu().clone(),
                "sparsity_window": {"counts": self.dead.fire_counts.cpu().clone(), "tokens": self.dead.window_tokens},
                "history": self.history,
                "train_config": dataclasses.asdict(self.config)}

    def save(self, folder) -> Path:
        return save_sae_checkpoint(folder, self.sae, self.state())

    @classmethod
    def resume(cls, folder, model, tokens: torch.Tensor, bos_id: int, ignore_ids=None, device=None,
               checkpoint_dir=None, log: Optional[Callable] = None, progress: bool = True) -> "SAETrainer":
        """A trainer continuing the checkpoint in ``folder``: same SAE, optimizer, data order and
        counters. Raises CheckpointError if the checkpoint is damaged or its parts do not fit."""
        sae_cfg, sae_state, state = load_sae_checkpoint(folder)
        try:
            config = SAETrainConfig(**state["train_config"])
            dtype = sae_state["W_enc"].dtype
            device = torch.device(device) if device is not None else next(model.parameters()).device
            sae = sae_class(sae_cfg.architecture)(sae_cfg, device=device, dtype=dtype)
            sae.load_state_dict(sae_state, strict=True)
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {folder} does not fit together: {first_line(error)}") from error
        trainer = cls(model, tokens, config, bos_id, ignore_ids, device=device, dtype=dtype, sae=sae,
                      checkpoint_dir=checkpoint_dir if checkpoint_dir is not None else folder, log=log,
                      progress=progress)
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
            trainer.stream.load_state(state["stream"])
            trainer.resample_rng.set_state(state["resample_rng"])
            since = state["steps_since_fired"]
            if tuple(since.shape) != (config.d_sae,):
                raise ValueError(f"steps_since_fired has shape {tuple(since.shape)}, not ({config.d_sae},)")
            trainer.dead.steps_since_fired.copy_(since)
            window = state["sparsity_window"]
            trainer.dead.fire_counts.copy_(window["counts"])
            trainer.dead.window_tokens = int(window["tokens"])
            step, history = int(state["step"]), state["history"]
            if not 0 <= step <= config.steps or set(history) != {"train"}:
                raise ValueError(f"step {step} of {config.steps} with history keys {sorted(history)}")
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"damaged trainer state in {Path(folder) / STATE_FILE}: "
                                  f"{first_line(error)}") from error
        trainer.step, trainer.history = step, history
        return trainer


def default_ignore_ids(model, bos_id: int) -> list:
    """SAELens's excluded tokens: the tokenizer's structural special ids, else just the BOS."""
    try:
        tokenizer = model.tokenizer
    except ValueError:
        return [bos_id]
    return sorted(set(special_token_ids(tokenizer)) | {bos_id})


def _progress(enabled: bool, initial: int, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train-sae", unit="step", dynamic_ncols=True)
