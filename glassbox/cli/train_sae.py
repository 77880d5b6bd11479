"""``glassbox train-sae``: train a sparse autoencoder on a model's activations over a text file, then
evaluate it on the text's held-out end, as SAELens evaluates SAEs. With ``--transcoders per-layer|cross-layer``
it trains a transcoder set instead (``train_transcoders.py``).

The text is split as ``glassbox train`` splits it (the last ``--heldout-frac``, 5% by default, cut at
a line break, is held out; for glassbox-austen and data/austen.txt that is the model's own held-out
text). The SAE trains on the first part (``glassbox.train.sae.train_sae``: windows of
``--context-size`` tokens starting with the BOS, activations at ``--hook`` through a shuffling
buffer, the BOS and other special tokens left out) and is evaluated on consecutive windows of the
held-out part (``glassbox.interp.sae.evals.evaluate_sae``: L0, explained variance, MSE, CE loss
recovered with the error term off against zero ablation, KL, dead fraction over the held-out tokens);
``evals.json`` holds them, the windows' count and size, and each feature's firing frequency over the
held-out tokens (``feature_density``).

DIR ends up holding ``sae/``, the SAE in SAELens's format (``cfg.json``, ``sae_weights.safetensors``;
``glassbox.interp.sae.format.load_sae`` and SAELens's ``SAE.load_from_disk`` read it), ``evals.json``,
``train_sae_log.jsonl`` (one line per step), ``train_sae_settings.json`` and ``checkpoint/``. DIR
must be new or empty; ``--resume`` continues the run in DIR (the settings not given are the run's;
those given must be the run's; the text and model must be the same). Mistakes print one line
``glassbox train-sae: error: ...`` naming the argument, and exit 2; every argument is checked before
the model's weights load (the hook and context size against its config alone), except that the held-out
part holds a window, which needs the tokenizer: checked after loading, before training.
"""

import argparse
import json
import math
import re
import time
from pathlib import Path

from .common import load_model, seed_arg, tokenizer_of
from .errors import UsageError, device_arg, user_errors
from .help_values import DEFAULT_MODEL

DTYPES = ("bfloat16", "float16", "float32", "float64")  # the SAE's dtype, a name of torch's


def _number(kind, low, low_open=False):
    words = "a whole number" if kind is int else "a finite number"
    accepted = f"{words} {'>' if low_open else '>='} {low:g}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}") from None
        if value < low or (low_open and value == low) or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}")
        return value

    parse.__name__ = accepted
    return parse


POSITIVE, COUNT = _number(int, 1), _number(int, 0)
NONNEG, POSITIVE_FLOAT = _number(float, 0.0), _number(float, 0.0, low_open=True)
# The run's settings: flag name -> (type, default, help). The defaults are train_sae's; --resume
# takes the run's recorded value for every setting not given.
SETTINGS = {
    "hook": (str, None, "hook point whose activations the SAE reconstructs, e.g. blocks.0.hook_resid_post"),
    "d_sae": (POSITIVE, None, "number of features"),
    "architecture": (str, "topk", "topk (TopK + AuxK dead-feature loss) or standard (ReLU + L1, dead features "
                                  "resampled)"),
    "k": (POSITIVE, None, "features kept per token (topk; required there)"),
    "l1_coefficient": (NONNEG, 1.0, "L1 coefficient, on activations times decoder norms (standard)"),
    "l1_warmup_steps": (COUNT, 0, "steps over which the L1 coefficient rises linearly from 0 (standard)"),
    "aux_k_coefficient": (NONNEG, 1.0, "weight of the AuxK loss (topk)"),
    "steps": (POSITIVE, 1000, "optimizer steps"),
    "batch_tokens": (POSITIVE, 4096, "activations (tokens) per step"),
    "lr": (POSITIVE_FLOAT, 3e-4, "Adam learning rate"),
    "lr_warmup_steps": (COUNT, 0, "linear learning-rate warm-up steps"),
    "lr_decay_steps": (COUNT, 0, "linear decay to 0 over the last steps"),
    "seed": (seed_arg, 0, "seed of the SAE's initial weights and of the data order"),
    "context_size": (POSITIVE, None, "tokens per window, BOS included (default: the model's n_ctx)"),
    "buffer_batches": (POSITIVE, 16, "batches per fill of the shuffling buffer"),
    "model_batch": (POSITIVE, 16, "windows per model forward when filling the buffer"),
    "dead_feature_window": (POSITIVE, 1000, "a feature that has not fired for more steps than this is dead"),
    "feature_sampling_window": (COUNT, 2000, "steps between resamplings of dead features (standard; 0: never)"),
    "decoder_init_norm": (POSITIVE_FLOAT, 0.1, "norm of the initial decoder rows"),
    "b_dec_init": (str, "zeros", "initial decoder bias: zeros (SAELens 6) or mean (of the first buffer's "
                                 "activations)"),
    "checkpoint_every": (COUNT, 500, "steps between checkpoints (0: only at the end)"),
}
# train_sae's names for the flags that differ.
API_NAMES = {"hook": "hook_name"}


def add_parser(sub) -> None:
    p = sub.add_parser("train-sae", help="train an SAE on a model's activations over a text file, "
                                         "evaluated as SAELens does")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model folder, shipped or hub model (default {DEFAULT_MODEL})")
    p.add_argument("--text", required=True,
                   help="a UTF-8 text file (its last --heldout-frac is held out for the evals)")
    p.add_argument("--out", required=True,
                   help="output folder: sae/ (the SAE in SAELens's format), evals.json, checkpoint/, the log")
    for name, (kind, default, help_text) in SETTINGS.items():
        shown = help_text if default is None else f"{help_text} (default: {default:g})" \
            if isinstance(default, float) else f"{help_text} (default: {default})"
        flag = "--" + name.replace("_", "-")
        if name in ("architecture", "b_dec_init"):
            choices = ("topk", "standard") if name == "architecture" else ("zeros", "mean")
            p.add_argument(flag, choices=choices, default=None, help=shown)
        else:
            p.add_argument(flag, type=kind, default=None, help=shown + (" (required)" if name in ("hook", "d_sae")
                                                                         else ""))
    p.add_argument("--heldout-frac", type=_heldout, default=0.05,
                   help="share of the text, at its end, held out for the evals (default: 0.05, as glassbox train)")
    p.add_argument("--eval-windows", type=POSITIVE, default=None,
                   help="evaluate on at most this many held-out windows (default: all of them)")
    p.add_argument("--eval-batch-size", type=POSITIVE, default=8, help="windows per eval forward (default: 8)")
    p.add_argument("--include-special-tokens", action="store_true",
                   help="train and evaluate on the BOS and other special tokens too (default: left out, as "
                        "SAELens's exclude_special_tokens)")
    p.add_argument("--transcoders", choices=("per-layer", "cross-layer"), default=None,
                   help="train a transcoder set instead of an SAE: one transcoder per layer, or one cross-layer "
                        "transcoder (--d-sae features per layer; see --input-hook, --output-hook, --skip)")
    p.add_argument("--input-hook", default=None,
                   help="with --transcoders: the hook each layer's features read, relative to the block "
                        "(default: ln2.hook_out, the MLP's input)")
    p.add_argument("--output-hook", default=None,
                   help="with --transcoders: the hook each layer's set estimates (default: hook_mlp_out)")
    p.add_argument("--skip", action="store_true", help="with --transcoders: add linear skip connections")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (from its checkpoint)")
    p.add_argument("--device", type=device_arg, default=None, help="e.g. cuda; default: cpu")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="the SAE's dtype (the model runs in float32; default: float32)")
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _heldout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in (0, 1)")
    return value


def run(args) -> int:
    if args.transcoders is not None:
        from .train_transcoders import run as run_transcoders

        return run_transcoders(args)
    for name in ("input_hook", "output_hook"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is for --transcoders; an SAE reads and writes --hook")
    if args.skip:
        raise UsageError("--skip is for --transcoders")
    import torch

    from ..interp.sae.evals import evaluate_sae
    from ..train.data import encode_text, split_text
    from ..train.sae.api import SETTINGS as SETTINGS_FILE
    from ..train.sae import api
    from ..train.rundir import write_atomic

    start = time.perf_counter()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    text = _read_text(Path(args.text))
    given = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    if args.include_special_tokens:
        given["exclude_special_tokens"] = False
    dtype = args.dtype
    _check_out(out)
    if args.resume:
        recorded = _recorded(out, SETTINGS_FILE)
        for name, value in given.items():
            old = recorded["settings"].get(name)
            if old is not None and old != value:
                flag = _flag(name)
                raise UsageError(f"--resume with {flag}={value!r}, but the run in {out} has {flag}={old!r}; pass the "
                                 "run's settings (or leave them out)")
        settings = {**recorded["settings"], **given}
        dtype = dtype or recorded["dtype"]
        if dtype not in DTYPES:
            raise UsageError(f"--resume: {out / SETTINGS_FILE} records dtype {dtype!r}, not one of {', '.join(DTYPES)}")
    else:
        if out.is_dir() and any(out.iterdir()):
            raise UsageError(f"--out {out} is not empty; add --resume to continue the run there, or name a new "
                             "or empty folder")
        for name in ("hook", "d_sae"):
            if name not in given:
                raise UsageError(f"--{name.replace('_', '-')} is required")
        settings = {name: default for name, (_, default, _) in SETTINGS.items() if default is not None} | given
    architecture = settings.get("architecture", "topk")
    if architecture == "topk" and settings.get("k") is None:
        raise UsageError("--k is required with --architecture topk (features kept per token)")
    if architecture == "standard" and "k" in given:
        raise UsageError("--k is for --architecture topk; --architecture standard uses --l1-coefficient")
    if architecture == "standard":
        settings.pop("k", None)
    with user_errors(ValueError, prefix=f"--text {args.text}: "):
        train_text, heldout_text = split_text(text, args.heldout_frac)
    _check_settings(args.model, settings)
    model = load_model(args.model, device=args.device)
    tokenizer = tokenizer_of(model, args.model)
    context = settings.get("context_size") or model.cfg.n_ctx
    windows = heldout_windows(encode_text(heldout_text, tokenizer), context, tokenizer.bos_token_id,
                              args.eval_windows)
    if windows.shape[0] == 0:
        raise UsageError(f"--text {args.text}: the held-out part holds fewer than {context - 1} tokens, not one "
                         "window; use a longer text or a larger --heldout-frac")
    kwargs = {API_NAMES.get(name, name): value for name, value in settings.items()}
    print(f"{'resuming' if args.resume else 'training'} a {architecture} SAE at {settings['hook']} of {args.model} "
          f"({model.cfg.d_model}-wide residual stream) into {out}")
    with _as_flags(ValueError, KeyError, TypeError):
        sae = api.train_sae(model, train_text, out=out, resume=args.resume, device=args.device,
                            dtype=getattr(torch, dtype or "float32"), progress=not args.no_progress, **kwargs)
    if sae.cfg.metadata.get("context_size", context) != context:
        raise RuntimeError(f"the SAE was trained on windows of {sae.cfg.metadata['context_size']} tokens, the "
                           f"held-out windows have {context}")
    with _as_flags(ValueError):
        evals = evaluate_sae(model, sae.to(next(model.parameters()).device), windows, batch_size=args.eval_batch_size,
                             exclude_special_tokens=not args.include_special_tokens, feature_density=True)
    density = evals.pop("feature_density")
    record = {"evals": evals, "eval_windows": int(windows.shape[0]), "context_size": context,
              "heldout_frac": args.heldout_frac, "model": args.model, "text": str(args.text),
              "feature_density": density}
    write_atomic(out / "evals.json", json.dumps(record, indent=2) + "\n")
    print(f"held-out evals ({windows.shape[0]} windows, {evals['n_tokens']:,} tokens):")
    for name in ("l0", "explained_variance", "mse", "ce_loss_score", "ce_loss_without_sae", "ce_loss_with_sae",
                 "ce_loss_with_ablation", "kl_div_with_sae", "dead_fraction"):
        print(f"  {name:22s} {evals[name]:.6g}")
    print(f"SAE saved to {out / 'sae'} (SAELens's format); evals in {out / 'evals.json'} "
          f"[{time.perf_counter() - start:.0f} s]")
    return 0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_out(out: Path) -> None:
    """--out must be a folder or a new path whose nearest existing ancestor is a folder."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name a new or empty folder")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out} is under a file ({parent}); name a new or empty folder")
            break


def _check_settings(model_name: str, settings: dict) -> None:
    """Every setting checked against the model's config (read alone, no weights) before the model loads:
    the hook exists (a model built on the meta device lists them), the context fits, and SAETrainConfig
    accepts the rest."""
    from ..hooks.root import unknown_name_message
    from ..models import HookedTransformer
    from ..train.sae.trainer import SAETrainConfig
    from ..weights.pretrained import config_of
    from .common import accepted_models, model_folder

    if model_name == "":
        raise UsageError(f"--model is empty; give {accepted_models()}")
    folder = model_folder(model_name)
    try:
        cfg = config_of(folder)
    except (ValueError, OSError):
        return  # load_model reports what is wrong with the folder, as for the other commands
    hooks = HookedTransformer(cfg, init=False, device="meta").hook_dict
    hook = settings["hook"]
    if hook not in hooks:
        raise UsageError(f"--hook {hook!r} is not a hook of --model {model_name}: {unknown_name_message(hook, hooks)}")
    context = settings.get("context_size", cfg.n_ctx)
    if isinstance(context, int) and context > cfg.n_ctx:
        raise UsageError(f"--context-size={context} is more than the model's n_ctx={cfg.n_ctx}")
    options = {API_NAMES.get(name, name): value for name, value in settings.items()}
    options.setdefault("context_size", cfg.n_ctx)
    with _as_flags(ValueError, TypeError):
        SAETrainConfig(**options)


def heldout_windows(stream, context_size: int, bos_id: int, limit=None):
    """[window context_size] tensor: consecutive, non-overlapping windows ``[BOS] + (context_size - 1)``
    held-out tokens of the 1-d ``stream`` (the tail shorter than a window is left out), at most ``limit``."""
    import torch

    body = context_size - 1
    n = len(stream) // body if limit is None else min(limit, len(stream) // body)
    chunks = stream[:n * body].reshape(n, body)
    return torch.cat([torch.full((n, 1), bos_id, dtype=chunks.dtype), chunks], dim=1)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise UsageError(f"--text {path}: {'is a folder' if path.is_dir() else 'no such file'}; give a UTF-8 text file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"--text {path} is not UTF-8 text (byte at offset {error.start}); give a UTF-8 text file") \
            from None
    if not text.strip():
        raise UsageError(f"--text {path} is empty; give a text with several lines")
    return text


def _recorded(out: Path, settings_file: str) -> dict:
    """The settings of the run in ``out``, by flag name, and its dtype."""
    path = out / settings_file
    if not path.is_file():
        raise UsageError(f"--resume: --out {out} holds no SAE training run ({settings_file} is missing)")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        config = record["train_config"]
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"--resume: damaged run settings file {path}: {error}") from None
    names = {API_NAMES.get(name, name): name for name in SETTINGS}
    settings = {names[key]: value for key, value in config.items() if key in names and value is not None}
    if config.get("exclude_special_tokens") is False:
        settings["exclude_special_tokens"] = False
    return {"settings": settings, "dtype": record.get("dtype", "float32")}


class _as_flags:
    """Re-raise library errors as UsageError, with train_sae's argument names written as the flags."""

    def __init__(self, *types):
        self.types = types

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is None or not issubclass(kind, self.types):
            return False
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        message = (message.strip().splitlines() or [kind.__name__])[0].replace("resume=True", "--resume")
        names = {API_NAMES.get(n, n): n for n in SETTINGS} | {"exclude_special_tokens": "include_special_tokens"}
        for api, flag in sorted(names.items(), key=lambda item: -len(item[0])):
            message = re.sub(rf"(?<![\w-]){api}(?=\W|$)", "--" + flag.replace("_", "-"), message)
        raise UsageError(message) from error

