"""The transcoder-set trainer: every layer's transcoder (or one cross-layer transcoder) trained at once on
paired activations streamed from a glassbox model (``stream.py``), with the SAE trainer's recipe.

Per step: a batch of ``batch_tokens`` tokens' inputs ``x_l`` and targets ``y_l`` (every layer); the
features of each source layer ``s``, ``pre_s = x_s @ W_enc[s] + b_enc[s]``, with ``n_s`` the decoder norms
(each feature's decoders to all its targets together):
- ``"topk"``: ``a_s = TopK_k(relu(pre_s * n_s)) / n_s`` (the SAE trainer's rescaled TopK: the choice
  does not depend on the decoders' drifting norms);
- ``"relu"``: ``a_s = relu(pre_s)`` and the penalty ``l1 * sum_s (a_s * n_s).sum(-1).mean()``;
then ``out_t = sum_{s<=t} a_s @ W_dec[s][:, t-s] + b_dec[t] (+ x_t @ W_skip[t].T)`` and the loss
``sum_t ((out_t - y_t) ** 2).sum(-1).mean()`` (+ the penalty). Adam, gradient-norm clipping at 1.0, the
SAE trainer's learning-rate schedule. No dead-feature resampling or AuxK: dead features are counted
(``dead.py``'s rule, per feature over all layers) and reported.

Initialisation, from a CPU generator seeded by ``seed``: ``W_enc`` uniform in ±1/sqrt(d_model), ``b_enc``
0, each feature's decoders a uniform random direction of norm ``decoder_init_norm``, ``W_skip`` 0, and
``b_dec[t]`` the mean of the first buffer's targets at layer t (so the features start on the centred
output). ``final_set()`` folds the decoder norms into the encoders (unit decoder norms, the same
function up to rounding), as ``losses.fold_decoder_norms``.

Determinism: on the CPU a run is bit-for-bit repeatable for a seed and a thread count, and a run resumed
from a checkpoint continues bit for bit (the checkpoint holds the set, Adam's state, the stream's state
and the dead-feature counters).
"""

import copy
import dataclasses
import math
from pathlib import Path
from typing import Callable, Optional

import torch

from ...interp.transcoders.set import TranscoderSet
from ..checkpoint import STATE_FILE, CheckpointError, first_line, read_checkpoint, save_checkpoint
from ..sae.dead import DeadFeatures
from ..sae.losses import topk_relu
from ..sae.trainer import GRAD_CLIP, _progress
from .config import TranscoderTrainConfig
from .stream import PairedStream

STATE_KEYS = ("step", "optimizer", "stream", "steps_since_fired", "history", "train_config")


class _Saved:
    """What ``save_checkpoint`` writes: the set's state dict and the run's config as ``config.json``."""

    def __init__(self, ts: TranscoderSet, config: TranscoderTrainConfig):
        self.ts, self.cfg = ts, config

    def state_dict(self):
        return self.ts.state_dict()


def decoder_norms(ts: TranscoderSet, s: int) -> torch.Tensor:
    """[d_transcoder]: each feature of layer ``s``'s decoder norm over all its targets."""
    return ts.decoders[s].pow(2).sum(dim=(1, 2)).sqrt()


def new_set(model, config: TranscoderTrainConfig, device, dtype, metadata=None) -> TranscoderSet:
    """The initial set of a run (module docstring), b_dec zeros until the first buffer is seen."""
    g = torch.Generator().manual_seed(config.seed)
    n, d, f = model.cfg.n_layers, model.cfg.d_model, config.d_transcoder
    bound = 1 / math.sqrt(d)
    W_enc = (torch.rand(n, d, f, generator=g) * 2 - 1) * bound
    W_dec = []
    for s in range(n):
        w = torch.rand(f, n - s if config.cross_layer else 1, d, generator=g) * 2 - 1
        W_dec.append(w / w.pow(2).sum(dim=(1, 2), keepdim=True).sqrt() * config.decoder_init_norm)
    ts = TranscoderSet(W_enc, torch.zeros(n, f), W_dec, torch.zeros(n, d), input_hook=config.input_hook,
                       output_hook=config.output_hook, W_skip=torch.zeros(n, d, d) if config.skip else None,
                       activation="topk" if config.architecture == "topk" else "relu", k=config.k,
                       cross_layer=config.cross_layer, metadata=metadata)
    return ts.to(device, dtype)


def training_losses(ts: TranscoderSet, config: TranscoderTrainConfig, x: torch.Tensor, y: torch.Tensor,
                    l1_coefficient: float) -> dict:
    """The losses of one batch (module docstring); ``x``, ``y`` [layer rows d_model]."""
    n = ts.n_layers
    acts, scaled, penalty = [], [], None
    for s in range(n):
        norms = decoder_norms(ts, s)
        pre = x[s] @ ts.encoder[s] + ts.encoder_bias[s]
        if config.architecture == "topk":
            a = topk_relu(pre * norms, config.k)
            acts.append(a)
            scaled.append(a / norms)
        else:
            a = torch.relu(pre)
            acts.append(a)
            scaled.append(a)
            term = (a * norms).sum(-1).mean()
            penalty = term if penalty is None else penalty + term
    mse, fvu, estimates = None, [], []
    for t in range(n):
        out = ts.decoder_bias[t]
        for s in (range(t + 1) if ts.cross_layer else (t,)):
            out = out + scaled[s] @ ts.decoders[s][:, t - s if ts.cross_layer else 0, :]
        if ts.skip:
            out = out + x[t] @ ts.skip_weights[t].T
        estimates.append(out)
        err = (out - y[t]).pow(2).sum(-1).mean()
        mse = err if mse is None else mse + err
        with torch.no_grad():
            fvu.append((err / (y[t] - y[t].mean(0)).pow(2).sum(-1).mean()).item())
    result = {"mse_loss": mse, "acts": acts, "fvu": fvu, "estimates": estimates}
    if penalty is not None:
        result["l1_loss"] = l1_coefficient * penalty
        result["loss"] = mse + result["l1_loss"]
    else:
        result["loss"] = mse
    return result


@torch.no_grad()
def fold_decoder_norms(ts: TranscoderSet) -> None:
    """Unit decoder norms (each feature over all its targets), the norms folded into W_enc and b_enc."""
    for s in range(ts.n_layers):
        norms = decoder_norms(ts, s)
        ts.encoder[s].mul_(norms[None, :])
        ts.encoder_bias[s].mul_(norms)
        ts.decoders[s].div_(norms[:, None, None])


class TranscoderTrainer:
    """Trains a TranscoderSet on ``model``'s paired activations over ``tokens`` (1-D ids)."""

    def __init__(self, model, tokens: torch.Tensor, config: TranscoderTrainConfig, bos_id: int, ignore_ids=None,
                 device=None, dtype: torch.dtype = torch.float32, ts: Optional[TranscoderSet] = None,
                 metadata: Optional[dict] = None, checkpoint_dir=None, log: Optional[Callable] = None,
                 progress: bool = True):
        if not isinstance(config, TranscoderTrainConfig):
            raise TypeError(f"config must be a TranscoderTrainConfig, got {type(config).__name__}")
        if config.context_size > model.cfg.n_ctx:
            raise ValueError(f"context_size={config.context_size} is more than the model's n_ctx={model.cfg.n_ctx}")
        self.model, self.config = model.eval(), config
        device = torch.device(device) if device is not None else next(model.parameters()).device
        fresh = ts is None
        self.ts = new_set(model, config, device, dtype, metadata) if fresh else ts
        self.ts.check_fits(model)
        self.stream = PairedStream(model, tokens, config.input_hook, config.output_hook, config.context_size,
                                   config.batch_tokens, config.buffer_batches, config.model_batch, bos_id,
                                   (ignore_ids or [bos_id]) if config.exclude_special_tokens else [],
                                   torch.Generator().manual_seed(config.seed + 1), self.ts.device, self.ts.dtype)
        self.optimizer = torch.optim.Adam(self.ts.parameters(), lr=config.lr,
                                          betas=(config.adam_beta1, config.adam_beta2), foreach=False)
        self.dead = DeadFeatures(self.ts.n_layers * config.d_transcoder, config.dead_feature_window, self.ts.device)
        self.step, self.history, self.fresh = 0, {"train": []}, fresh
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.log, self.progress = log, progress

    def run(self, until: Optional[int] = None) -> dict:
        cfg = self.config
        until = cfg.steps if until is None else until
        if not self.step <= until <= cfg.steps:
            raise ValueError(f"until={until} must be in [current step {self.step}, steps={cfg.steps}]")
        if self.step == 0 and self.fresh and self.stream.buffer is None:
            self.stream.fill()  # the first batches are served from this buffer
            with torch.no_grad():
                _, y = self.stream.split(self.stream.buffer)
                self.ts.decoder_bias.copy_(y.mean(1))
        bar = _progress(self.progress, self.step, until)
        try:
            while self.step < until:
                record = self.train_step()
                if self.log is not None:
                    self.log(record)
                if self.checkpoint_dir is not None and (
                        self.step == until or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)):
                    self.save(self.checkpoint_dir)
                if bar is not None:
                    bar.set_postfix(L0=f"{record['l0']:.1f}", FVU=f"{max(record['fvu']):.3f}",
                                    dead=record["dead_features"], refresh=False)
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return self.history

    def train_step(self) -> dict:
        cfg, ts = self.config, self.ts
        lr = cfg.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.stream.split(self.stream.next_batch())
        out = training_losses(ts, cfg, x, y, cfg.l1_at(self.step))
        loss = out["loss"].item()
        if not math.isfinite(loss):
            bad = "the activations hold NaN or inf" if not bool(torch.isfinite(x).all() and torch.isfinite(y).all()) \
                else f"the weights or lr={lr:g} diverged"
            raise ValueError(f"transcoder training step {self.step + 1}: the loss is {loss} ({bad}); nothing was "
                             f"updated, and the set is that of step {self.step}")
        acts = torch.cat(out["acts"], dim=-1).detach()
        self.dead.update(acts)
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(ts.parameters(), GRAD_CLIP, foreach=False)
        self.optimizer.step()
        self.step += 1
        l0 = (acts != 0).sum(-1).float().mean().item() / ts.n_layers
        record = {"step": self.step, "lr": lr, "loss": loss, "mse_loss": out["mse_loss"].item(), "l0": l0,
                  "fvu": out["fvu"], "dead_features": int(self.dead.mask().sum())}
        if "l1_loss" in out:
            record["l1_loss"] = out["l1_loss"].item()
        self.history["train"].append([self.step, loss, record["mse_loss"], l0])
        return record

    def final_set(self) -> TranscoderSet:
        """A copy of the set with unit decoder norms (``fold_decoder_norms``), without gradients."""
        ts = copy.deepcopy(self.ts)
        fold_decoder_norms(ts)
        for p in ts.parameters():
            p.requires_grad_(False)
        return ts

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "optimizer": self.optimizer.state_dict(), "stream": self.stream.state(),
                "steps_since_fired": self.dead.steps_since_fired.cpu().clone(), "history": self.history,
                "train_config": dataclasses.asdict(self.config)}

    def save(self, folder) -> Path:
        return save_checkpoint(folder, _Saved(self.ts, self.config), self.state())

    @classmethod
    def resume(cls, folder, model, tokens: torch.Tensor, bos_id: int, ignore_ids=None, device=None,
               checkpoint_dir=None, log: Optional[Callable] = None, progress: bool = True,
               metadata: Optional[dict] = None) -> "TranscoderTrainer":
        """A trainer continuing the checkpoint in ``folder``; CheckpointError names a damaged file."""
        config, set_state, state = read_checkpoint(folder, TranscoderTrainConfig, STATE_KEYS,
                                                   "transcoder training checkpoint", "a transcoder trainer state")
        try:
            dtype = set_state["encoder"].dtype
            device = torch.device(device) if device is not None else next(model.parameters()).device
            ts = new_set(model, config, device, dtype, metadata)
            ts.load_state_dict(set_state, strict=True)
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"checkpoint {folder} does not fit together: {first_line(error)}") from error
        trainer = cls(model, tokens, config, bos_id, ignore_ids, device=device, dtype=dtype, ts=ts,
                      checkpoint_dir=checkpoint_dir if checkpoint_dir is not None else folder, log=log,
                      progress=progress)
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
            trainer.stream.load_state(state["stream"])
            since = state["steps_since_fired"]
            trainer.dead.steps_since_fired.copy_(since)
            step, history = int(state["step"]), state["history"]
            if not 0 <= step <= config.steps or set(history) != {"train"}:
                raise ValueError(f"step {step} of {config.steps} with history keys {sorted(history)}")
        except (RuntimeError, TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"damaged trainer state in {Path(folder) / STATE_FILE}: "
                                  f"{first_line(error)}") from error
        trainer.step, trainer.history = step, history
        return trainer
