"""``glassbox train-sae --transcoders per-layer|cross-layer``: train a transcoder set (every layer of the model
at once) on its activations over a text file, then evaluate it on the held-out end.

The text is split and windowed as for an SAE (``train_sae.py``). The set reads ``blocks.{l}.<--input-hook>``
(default ``ln2.hook_out``, the MLP's input) and estimates ``blocks.{l}.<--output-hook>`` (default
``hook_mlp_out``) at every layer; ``--d-sae`` is the number of features per layer; ``--architecture topk``
(with ``--k``, per layer) or ``standard`` (ReLU + ``--l1-coefficient``); ``--skip`` adds skip connections
(``glassbox.train.transcoders``). DIR ends up holding ``transcoders/`` (circuit-tracer's layout,
``glassbox.interp.transcoders.load_circuit_tracer``), ``evals.json`` (``interp.transcoders.evals``: FVU, L0
and dead fraction per layer, CE loss recovered with the replacement spliced in), ``train_sae_log.jsonl``,
``train_sae_settings.json`` and ``checkpoint/``. ``--resume`` continues the run (settings not given are the
run's; those given must be the run's).
"""

import json
import time
from pathlib import Path

from .errors import UsageError

# flag name -> TranscoderTrainConfig field, for the SAE flags a transcoder run shares
SHARED = ("k", "l1_coefficient", "l1_warmup_steps", "steps", "batch_tokens", "lr", "lr_warmup_steps",
          "lr_decay_steps", "seed", "context_size", "buffer_batches", "model_batch", "dead_feature_window",
          "decoder_init_norm", "checkpoint_every")
SAE_ONLY = ("hook", "aux_k_coefficient", "feature_sampling_window", "b_dec_init")


def run(args) -> int:
    import torch

    from ..interp.transcoders.evals import evaluate_transcoders
    from ..train.data import encode_text, split_text
    from ..train.rundir import write_atomic
    from ..train.sae.api import SETTINGS as SETTINGS_FILE
    from ..train.transcoders import TranscoderTrainConfig, train_transcoders
    from .common import load_model, tokenizer_of
    from .train_sae import DTYPES, _as_flags, _check_out, _read_text, heldout_windows

    start = time.perf_counter()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for name in SAE_ONLY:
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is for an SAE; a transcoder set reads --input-hook and "
                             "writes --output-hook at every layer")
    out = Path(args.out)
    text = _read_text(Path(args.text))
    _check_out(out)
    given = {name: getattr(args, name) for name in SHARED if getattr(args, name) is not None}
    if args.d_sae is not None:
        given["d_transcoder"] = args.d_sae
    if args.architecture is not None:
        given["architecture"] = "relu" if args.architecture == "standard" else "topk"
    for name in ("input_hook", "output_hook"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    given["cross_layer"] = args.transcoders == "cross-layer"
    if args.skip:
        given["skip"] = True
    if args.include_special_tokens:
        given["exclude_special_tokens"] = False
    dtype = args.dtype
    if args.resume:
        path = out / SETTINGS_FILE
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            recorded, recorded_dtype = record["train_config"], record.get("dtype", "float32")
            assert record.get("kind") == "transcoders"
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            raise UsageError(f"--resume: --out {out} holds no transcoder training run ({path} is missing or "
                             "not one)") from None
        for name, value in given.items():
            if name in recorded and recorded[name] != value and not (name == "skip" and value is False):
                raise UsageError(f"--resume with {name}={value!r}, but the run in {out} has {name}={recorded[name]!r}; "
                                 "pass the run's settings (or leave them out)")
        settings = {**recorded, **given}
        dtype = dtype or recorded_dtype
    else:
        if out.is_dir() and any(out.iterdir()):
            raise UsageError(f"--out {out} is not empty; add --resume to continue the run there, or name a new "
                             "or empty folder")
        if "d_transcoder" not in given:
            raise UsageError("--d-sae (features per layer) is required")
        settings = {"input_hook": "ln2.hook_out", "architecture": "topk", **given}
    if dtype not in DTYPES and dtype is not None:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if settings.get("architecture") == "topk" and settings.get("k") is None:
        raise UsageError("--k is required with --architecture topk (features kept per token and layer)")
    if settings.get("architecture") == "relu" and settings.get("k") is not None:
        raise UsageError("--k is for --architecture topk; --architecture standard uses --l1-coefficient")
    with _as_flags(ValueError, TypeError):
        TranscoderTrainConfig(**{"context_size": 2, **settings})  # every setting checked before the model loads
    with _as_flags(ValueError):
        train_text, heldout_text = split_text(text, args.heldout_frac)
    model = load_model(args.model, device=args.device)
    tokenizer = tokenizer_of(model, args.model)
    context = settings.get("context_size") or model.cfg.n_ctx
    if context > model.cfg.n_ctx:
        raise UsageError(f"--context-size={context} is more than the model's n_ctx={model.cfg.n_ctx}")
    windows = heldout_windows(encode_text(heldout_text, tokenizer), context, tokenizer.bos_token_id, args.eval_windows)
    if windows.shape[0] == 0:
        raise UsageError(f"--text {args.text}: the held-out part holds fewer than {context - 1} tokens, not one "
                         "window; use a longer text or a larger --heldout-frac")
    kind = "cross-layer" if settings["cross_layer"] else "per-layer"
    print(f"{'resuming' if args.resume else 'training'} a {kind} {settings['architecture']} transcoder set "
          f"({settings['input_hook']} -> {settings.get('output_hook', 'hook_mlp_out')}, {model.cfg.n_layers} layers) "
          f"of {args.model} into {out}")
    options = {key: value for key, value in settings.items() if key not in ("input_hook", "d_transcoder")}
    with _as_flags(ValueError, KeyError, TypeError):
        ts = train_transcoders(model, train_text, settings["input_hook"], settings["d_transcoder"], out=out,
                               resume=args.resume, device=args.device, dtype=getattr(torch, dtype or "float32"),
                               progress=not args.no_progress, **options)
    with _as_flags(ValueError):
        evals = evaluate_transcoders(model, ts.to(next(model.parameters()).device), windows,
                                     batch_size=args.eval_batch_size, exclude_special_tokens=not args.include_special_tokens)
    record = {"evals": evals, "eval_windows": int(windows.shape[0]), "context_size": context,
              "heldout_frac": args.heldout_frac, "model": args.model, "text": str(args.text)}
    write_atomic(out / "evals.json", json.dumps(record, indent=2) + "\n")
    print(f"held-out evals ({windows.shape[0]} windows, {evals['n_tokens']:,} tokens):")
    for name in ("fvu", "l0", "dead_fraction"):
        print(f"  {name:26s} " + " ".join(f"{v:.4g}" for v in evals[name]) + "  (per layer)")
    for name in ("ce_loss_score", "ce_loss_without_replacement", "ce_loss_with_replacement", "ce_loss_with_ablation"):
        print(f"  {name:26s} {evals[name]:.6g}")
    print(f"transcoders saved to {out / 'transcoders'} (circuit-tracer's layout); evals in {out / 'evals.json'} "
          f"[{time.perf_counter() - start:.0f} s]")
    return 0
