"""``train_transcoders``: train a per-layer or cross-layer TranscoderSet on a glassbox model over local text.

With ``out=DIR`` the run keeps, as ``train_sae`` does (``glassbox.train.sae.api``): ``train_sae_settings.json``
(the settings, dtype and the SHA-256 of the tokens and of the model's weights, so that ``resume=True``
refuses other settings, data or model), ``checkpoint/`` and ``train_sae_log.jsonl``; at the end
``transcoders/``, the set in circuit-tracer's layout (``glassbox.interp.transcoders.save_circuit_tracer``;
``load_circuit_tracer`` reads it, and circuit-tracer does for ReLU sets). ``DIR`` must be new or empty
unless ``resume=True``.
"""

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ..checkpoint import recover_checkpoint
from ..sae.api import CHECKPOINT, open_run, resolve_bos, run_settings, start_run, token_stream
from ..sae.trainer import default_ignore_ids
from .config import TranscoderTrainConfig
from .trainer import TranscoderTrainer

SET_FOLDER = "transcoders"


def train_transcoders(model, text_or_tokens: Union[str, torch.Tensor], input_hook: str, d_transcoder: int,
                      cross_layer: bool = False, architecture: str = "topk", k: Optional[int] = None,
                      steps: int = 1000, batch_tokens: int = 4096, lr: float = 3e-4, seed: int = 0, out=None,
                      resume: bool = False, device=None, dtype: torch.dtype = torch.float32, progress: bool = True,
                      context_size: Optional[int] = None, bos_id: Optional[int] = None,
                      log: Optional[Callable] = None, **options):
    """Train a TranscoderSet (``TranscoderTrainConfig``'s fields; ``options`` the rest of them).

    Returns the trained set with unit decoder norms (``TranscoderTrainer.final_set``)."""
    fields = {f.name for f in dataclasses.fields(TranscoderTrainConfig)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(f"train_transcoders got unknown options {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    tokens = token_stream(model, text_or_tokens)
    bos = resolve_bos(model, bos_id)
    config = TranscoderTrainConfig(input_hook=input_hook, d_transcoder=d_transcoder, cross_layer=cross_layer,
                                   architecture=architecture, k=k, steps=steps, batch_tokens=batch_tokens, lr=lr,
                                   seed=seed, context_size=model.cfg.n_ctx if context_size is None else context_size,
                                   **options)
    ignore = default_ignore_ids(model, bos)
    metadata = {"model_name": model.cfg.model_name, "context_size": config.context_size, "prepend_bos": True}
    kwargs = dict(bos_id=bos, ignore_ids=ignore, device=device, progress=progress)
    if out is None:
        if resume:
            raise ValueError("resume=True continues the run in out=DIR; no out was given")
        trainer = TranscoderTrainer(model, tokens, config, dtype=dtype, metadata=metadata, log=log, **kwargs)
        trainer.run()
        return trainer.final_set()
    from ...interp.transcoders.circuit_tracer import save_circuit_tracer

    out = Path(out)
    settings = run_settings(model, tokens, config, dtype, kind="transcoders")
    write_log = open_run(out, settings, resume, log)
    checkpoint = out / CHECKPOINT
    if resume and recover_checkpoint(checkpoint):
        trainer = TranscoderTrainer.resume(checkpoint, model, tokens, log=write_log, metadata=metadata, **kwargs)
    else:
        trainer = TranscoderTrainer(model, tokens, config, dtype=dtype, metadata=metadata, checkpoint_dir=checkpoint,
                                    log=write_log, **kwargs)
    start_run(out, settings, resume, trainer.step)
    trainer.run()
    ts = trainer.final_set()
    save_circuit_tracer(ts, out / SET_FOLDER, overwrite=True)
    return ts
