"""``train_sae``: train an SAE on a glassbox model's activations over local text, in a run folder.

With ``out=DIR`` the run keeps, in ``DIR``:
- ``train_sae_settings.json``: the run's settings (``SAETrainConfig``), the SAE dtype, and SHA-256
  digests of the token stream and of the model's weights, written before anything else, so that
  ``resume=True`` refuses other settings, other data or another model;
- ``checkpoint/`` (every ``checkpoint_every`` steps and at the end; see ``checkpoint.py``) and
  ``train_sae_log.jsonl`` (one JSON line per step: losses, L0, explained variance, lr, dead features);
- at the end, ``sae/``: the SAE in SAELens's folder format (``cfg.json``, ``sae_weights.safetensors``,
  and ``sparsity.safetensors``: log10 firing frequencies over the last ``feature_sampling_window``
  steps), which ``glassbox.interp.sae.format.load_sae`` and SAELens's ``SAE.load_from_disk`` read.
``DIR`` must be new or empty unless ``resume=True``, which continues from ``DIR/checkpoint``
(bit-for-bit on the CPU; a run that stopped before its first checkpoint starts again) and drops the
log lines past the checkpoint; resuming a finished run trains nothing and saves the SAE again.

Text is tokenized with the model's tokenizer as one stream (``glassbox.train.data.encode_text``);
the BOS is the tokenizer's (a model without a tokenizer needs token ids and ``bos_id``).
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from ...fs import append_text
from ..checkpoint import recover_checkpoint
from ..data import encode_text
from ..rundir import trim_log, write_atomic
from .checkpoint import save_final
from .trainer import SAETrainConfig, SAETrainer, default_ignore_ids

CHECKPOINT, LOG, SETTINGS, SAE_FOLDER = "checkpoint", "train_sae_log.jsonl", "train_sae_settings.json", "sae"


def token_stream(model, text_or_tokens) -> torch.Tensor:
    """The 1-D int64 CPU token stream of a text (the model's tokenizer) or of given ids."""
    if isinstance(text_or_tokens, str):
        try:
            tokenizer = model.tokenizer
        except ValueError:
            raise ValueError("text_or_tokens is text, but the model has no tokenizer; pass token ids "
                             "(a 1-D tensor) and bos_id") from None
        return encode_text(text_or_tokens, tokenizer)
    if not isinstance(text_or_tokens, torch.Tensor) or text_or_tokens.dtype.is_floating_point or \
            text_or_tokens.dtype == torch.bool:
        raise TypeError(f"text_or_tokens must be a str or an integer tensor of token ids, got "
                        f"{type(text_or_tokens).__name__}")
    tokens = text_or_tokens.reshape(-1).long().cpu()
    if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < model.cfg.d_vocab:
        raise ValueError(f"text_or_tokens holds ids outside [0, d_vocab={model.cfg.d_vocab})")
    return tokens


def digest(tensors) -> str:
    h = hashlib.sha256()
    for tensor in tensors:
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def resolve_bos(model, bos_id: Optional[int]) -> int:
    if bos_id is not None:
        if isinstance(bos_id, bool) or not isinstance(bos_id, int) or not 0 <= bos_id < model.cfg.d_vocab:
            raise ValueError(f"bos_id must be a token id in [0, {model.cfg.d_vocab}), got {bos_id!r}")
        return bos_id
    try:
        bos = model.tokenizer.bos_token_id
    except ValueError:
        bos = None
    if bos is None:
        raise ValueError("the model has no tokenizer with a BOS token; pass bos_id")
    return int(bos)


def train_sae(model, text_or_tokens: Union[str, torch.Tensor], hook_name: str, d_sae: int,
              architecture: str = "topk", k: Optional[int] = None, l1_coefficient: float = 1.0, steps: int = 1000,
              batch_tokens: int = 4096, lr: float = 3e-4, seed: int = 0, out=None, resume: bool = False,
              device=None, dtype: torch.dtype = torch.float32, progress: bool = True,
              context_size: Optional[int] = None, bos_id: Optional[int] = None,
              log: Optional[Callable] = None, **options):
    """Train an SAE (``architecture`` "topk" with ``k``, or "standard": ReLU + L1) at ``hook_name``.

    Args:
        model: a glassbox HookedTransformer (put in eval mode; its weights are not changed).
        text_or_tokens: the training text, or its token ids (1-D).
        d_sae: number of features. steps, batch_tokens (activations per step), lr, seed: the recipe.
        out: the run folder (module docstring); None keeps nothing on disk.
        resume: continue the run in ``out`` (the arguments must be the run's).
        device, dtype: the SAE's (default: the model's device, float32); activations are cast to them.
        context_size: tokens per window, BOS included (default: the model's n_ctx).
        log: called with each step's record (a dict), after it is written to the log file.
        **options: the other ``SAETrainConfig`` fields (l1_warmup_steps, aux_k_coefficient,
            lr_warmup_steps, lr_decay_steps, adam_beta1/2, buffer_batches, model_batch,
            exclude_special_tokens, dead_feature_window, feature_sampling_window, decoder_init_norm,
            b_dec_init, checkpoint_every).
    Returns:
        the trained SAE, decoder rows folded to norm 1, in eval mode.
    """
    fields = {f.name for f in dataclasses.fields(SAETrainConfig)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(f"train_sae got unknown options {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    tokens = token_stream(model, text_or_tokens)
    bos = resolve_bos(model, bos_id)
    config = SAETrainConfig(hook_name=hook_name, d_sae=d_sae, architecture=architecture, k=k,
                            l1_coefficient=l1_coefficient, steps=steps, batch_tokens=batch_tokens, lr=lr, seed=seed,
                            context_size=model.cfg.n_ctx if context_size is None else context_size, **options)
    ignore = default_ignore_ids(model, bos)
    metadata = {"model_name": model.cfg.model_name, "hook_name": hook_name, "hook_head_index": None,
                "context_size": config.context_size, "prepend_bos": True,
                "exclude_special_tokens": ignore if config.exclude_special_tokens else False,
                "seqpos_slice": [None]}
    kwargs = dict(bos_id=bos, ignore_ids=ignore, device=device, progress=progress)
    if out is None:
        if resume:
            raise ValueError("resume=True continues the run in out=DIR; no out was given")
        trainer = SAETrainer(model, tokens, config, dtype=dtype, metadata=metadata, log=log, **kwargs)
        trainer.run()
        return trainer.final_sae()
    out = Path(out)
    settings = run_settings(model, tokens, config, dtype)
    write_log = open_run(out, settings, resume, log)
    checkpoint = out / CHECKPOINT
    if resume and recover_checkpoint(checkpoint):
        trainer = SAETrainer.resume(checkpoint, model, tokens, log=write_log, **kwargs)
    else:  # built before anything is written: a bad argument leaves no folder behind
        trainer = SAETrainer(model, tokens, config, dtype=dtype, metadata=metadata, checkpoint_dir=checkpoint,
                             log=write_log, **kwargs)
    start_run(out, settings, resume, trainer.step)
    trainer.run()
    sae = trainer.final_sae()
    save_final(sae, out / SAE_FOLDER, sparsity=trainer.log_sparsity())
    return sae


def run_settings(model, tokens: torch.Tensor, config, dtype, **extra) -> dict:
    """What a run folder records of its run, so that ``resume`` can refuse another one (``check_resume``)."""
    return {"train_config": dataclasses.asdict(config), "dtype": str(dtype).replace("torch.", ""),
            "tokens_sha256": digest([tokens]), "n_tokens": int(tokens.numel()),
            "model_sha256": digest(p for _, p in sorted(model.state_dict().items())), **extra}


def open_run(out: Path, settings: dict, resume: bool, log: Optional[Callable[[dict], None]]):
    """Check ``out`` for a new run (a new or empty folder) or a resumed one (the same settings); returns the
    function that appends a record to the run's log (and passes it to ``log``). Writes nothing."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"out={str(out)!r} is a file; name a new or empty folder")
    if resume:
        check_resume(out, settings)
    elif out.is_dir() and any(out.iterdir()):
        raise ValueError(f"out={str(out)!r} is not empty; pass resume=True to continue the run there, or "
                         "name a new or empty folder")

    def write_log(record: dict) -> None:
        append_text(out / LOG, json.dumps(record) + "\n")
        if log is not None:
            log(record)

    return write_log


def start_run(out: Path, settings: dict, resume: bool, step: int) -> None:
    """Once the trainer is built: a new run writes its folder and settings; the log keeps steps <= ``step``."""
    if not resume:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / SETTINGS, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    trim_log(out / LOG, step)


def check_resume(out: Path, settings: dict) -> None:
    """Refuse to resume ``out`` with other settings, data or model (naming the first difference)."""
    path = out / SETTINGS
    if not path.is_file():
        raise ValueError(f"out={str(out)!r} holds no SAE training run ({SETTINGS} is missing); resume=True "
                         "continues a run started with train_sae(out=...)")
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"damaged run settings file {path}: {error}") from error
    config, old = settings["train_config"], recorded.get("train_config", {})
    for name in config:
        if old.get(name) != config[name]:
            raise ValueError(f"resume=True with {name}={config[name]!r}, but the run in {out} has "
                             f"{name}={old.get(name)!r}; pass the run's settings")
    for name, what in (("dtype", "dtype"), ("tokens_sha256", "training data"), ("model_sha256", "model weights")):
        if recorded.get(name) != settings[name]:
            raise ValueError(f"resume=True with other {what} than the run in {out} was started with "
                             f"({name} {settings[name]!r} != {recorded.get(name)!r})")
