"""``glassbox train``: train a small transformer (a GPT-2 by default) and its BPE tokenizer on a text file.

With the default ``--arch gpt2``, DIR ends up a normal Hugging Face GPT-2 folder (config.json,
model.safetensors, vocab.json, merges.txt) that ``transformers`` and
``HookedTransformer.from_pretrained(DIR)`` both load, plus ``checkpoint/`` (to resume with
``--resume``), ``train_log.jsonl`` (one line per step), ``train_summary.json`` (final held-out loss
next to the unigram baseline) and ``train_settings.json`` (the settings and the text's SHA-256; see
``glassbox.train.rundir``).

``--arch`` picks a preset of ``glassbox.models.presets``; only ``gpt2`` exports to a Hugging Face
folder, the others keep their weights in ``checkpoint/``. The tokenizer is trained on the training
part of the text only; the last ``--heldout-frac`` of the text is held out for evaluation.
Runs are bit-for-bit repeatable on the CPU for a given seed and ``--threads``.

Nothing is written before every argument, the text and DIR have been checked (the tokenizer is
trained in a temporary folder, and the token counts checked, first). DIR must be new or empty;
one holding a run is continued with ``--resume`` (every setting given must then be the run's, and
the text the same) or replaced with ``--overwrite`` (only files a run writes are deleted; a folder
holding anything else is refused). Mistakes print one line ``glassbox train: error: ...``, exit 2.
"""

import argparse
import dataclasses
import json
import math
import tempfile
import time
from pathlib import Path

from .errors import UsageError, device_arg, user_errors
from .help_values import PRESET_NAMES

def _number(kind, low=None, high=None, low_open=False, high_open=False):
    """argparse ``type=``: an int or a finite float in a range, refused with the range in words."""
    words = "a whole number" if kind is int else "a finite number"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    accepted = words + (" " + " and ".join(bounds) if bounds else "")

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}") from None
        too_low = low is not None and (value < low or (low_open and value == low))
        too_high = high is not None and (value > high or (high_open and value == high))
        if too_low or too_high or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {accepted}")
        return value

    parse.__name__ = accepted
    return parse


POSITIVE, COUNT, FRACTION = _number(int, 1), _number(int, 0), _number(float, 0.0, 1.0)
# The settings that shape a run, name: (type, default, help). They are recorded in
# train_settings.json, and --resume refuses to change them.
SETTINGS = {
    "arch": (str, "gpt2", "architecture preset (glassbox.models.presets); only gpt2 exports to a Hugging Face folder"),
    "layers": (POSITIVE, 2, "transformer blocks"),
    "d_model": (POSITIVE, 128, "residual stream width"),
    "heads": (POSITIVE, 4, "attention heads (must divide --d-model)"),
    "n_ctx": (POSITIVE, 128, "tokens per training window"),
    "init_range": (_number(float, 0.0, low_open=True), None,
                   "std of the initial weight matrices (default: the preset's; GPT-2 uses 0.02)"),
    "untied": (bool, False, "a separate unembedding matrix instead of W_E's transpose"),
    "vocab_size": (_number(int, 258), 4096, "BPE vocabulary, <|endoftext|> included"),
    "steps": (POSITIVE, 2000, "optimizer steps"),
    "batch_size": (POSITIVE, 32, "windows per step"),
    "lr": (_number(float, 0.0, low_open=True), 1e-3, "peak learning rate"),
    "seed": (_number(int), 0, "seed of the weights and the data order"),
    "warmup_steps": (COUNT, None, "default: min(100, steps // 10)"),
    "weight_decay": (_number(float, 0.0), 0.1, "AdamW weight decay on the weight matrices"),
    "grad_clip": (_number(float, 0.0, low_open=True), 1.0, "gradient-norm clipping threshold"),
    "repeat_frac": (FRACTION, 0.0, "share of training windows that repeat a span (teaches induction; "
                                   "see glassbox.train.data)"),
    "random_repeat_frac": (FRACTION, 0.5, "share of repeated spans made of uniformly random tokens"),
    "min_repeat": (POSITIVE, 4, "shortest repeated span, in tokens"),
    "max_copies": (_number(int, 2), 2, "most copies of a repeated span in one window"),
    "heldout_frac": (_number(float, 0.0, 1.0, low_open=True, high_open=True), 0.05,
                     "share of the text, at its end, held out for evaluation"),
    "eval_every": (POSITIVE, 100, "steps between held-out evaluations"),
    "checkpoint_every": (COUNT, 500, "steps between checkpoints (0: only at the end)"),
}


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small transformer (GPT-2 by default, --arch) and its tokenizer on a text file")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face GPT-2 folder at the end)")
    for name, (kind, default, help_text) in SETTINGS.items():
        flag = "--" + name.replace("_", "-")
        shown = help_text if default is None or kind is bool else f"{help_text} (default: {default})"
        if kind is bool:
            p.add_argument(flag, action="store_const", const=True, default=None, help=shown)
        elif name == "arch":
            p.add_argument(flag, choices=PRESET_NAMES, default=None, help=f"{shown}")
        else:
            p.add_argument(flag, type=kind, default=None, help=shown)
    p.add_argument("--resume", action="store_true", help="continue the run in DIR (from DIR/checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="replace the run in DIR (only files a run writes)")
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", type=device_arg, default=None, help="e.g. cuda; default: cpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..train import load_tokenizer

    given = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    settings = {name: default for name, (_, default, _) in SETTINGS.items()} | given
    if settings["warmup_steps"] is None:
        settings["warmup_steps"] = min(100, settings["steps"] // 10)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out = Path(args.out)
    text = _read_text(Path(args.text))
    _check_out(out)
    if args.resume:
        trainer, tokenizer, train_stream = _resume(args, out, given, settings, text)
    else:
        train_text, heldout_text = _split(text, settings["heldout_frac"], args.text)
        model_cfg, config = _check_new_run(settings, out, text, train_text, heldout_text, args.overwrite)
        with tempfile.TemporaryDirectory(prefix="glassbox-tokenizer-") as scratch:
            tokenizer, train_stream, heldout_stream = _new_tokenizer(settings, scratch, train_text, heldout_text)
            _start_folder(out, settings, text, scratch, args.overwrite)
        tokenizer = load_tokenizer(out)
        print(f"tokenizer: {len(tokenizer)} tokens, written to {out} [{time.perf_counter() - start:.0f} s]")
        print(f"data: {len(train_stream):,} training tokens, {len(heldout_stream):,} held-out tokens")
        trainer = _new_trainer(args, out, settings, model_cfg, config, tokenizer, train_stream, heldout_stream)
    return _train_and_save(trainer, out, tokenizer, train_stream, start)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise UsageError(f"--text {path}: {'is a folder' if path.is_dir() else 'no such file'}; "
                         "give a UTF-8 text file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"--text {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset "
                         f"{error.start}); give a UTF-8 text file") from None
    if not text.strip():
        raise UsageError(f"--text {path} is empty; give a text with several lines")
    return text


def _split(text: str, heldout_frac: float, name: str) -> tuple:
    from ..train import split_text

    with user_errors(ValueError, prefix=f"--text {name}: "):
        return split_text(text, heldout_frac)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; name a new or empty folder")
    parent = out.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"--out {out}: {parent} is a file, so the folder cannot be made; name another folder")


def _check_new_run(settings: dict, out: Path, text: str, train_text: str, heldout_text: str,
                   overwrite: bool) -> tuple:
    """(model Config, TrainConfig) of a new run, every setting checked against the others and the
    text, and DIR checked; nothing is written."""
    from ..train import CheckpointError, TrainConfig
    from ..train.rundir import checkpoint_step, foreign_files, recorded_settings, text_digest

    s = settings
    if s["d_model"] % s["heads"]:
        divisors = [d for d in range(1, s["d_model"] + 1) if s["d_model"] % d == 0]
        raise UsageError(f"--heads {s['heads']} does not divide --d-model {s['d_model']}; use one of "
                         f"{', '.join(map(str, divisors[:12]))}")
    if s["warmup_steps"] > s["steps"]:
        raise UsageError(f"--warmup-steps {s['warmup_steps']} is more than --steps {s['steps']}; use 0 to "
                         f"{s['steps']}")
    if s["repeat_frac"] > 0 and 2 * s["min_repeat"] > s["n_ctx"]:
        raise UsageError(f"--min-repeat {s['min_repeat']} does not fit twice in --n-ctx {s['n_ctx']}; use at "
                         f"most {s['n_ctx'] // 2}, or --repeat-frac 0")
    # A byte-level BPE token is at least one byte: a part with fewer bytes than n_ctx is too short.
    for part, piece in (("training", train_text), ("held-out", heldout_text)):
        size = len(piece.encode("utf-8"))
        if size < s["n_ctx"]:
            raise UsageError(f"--n-ctx {s['n_ctx']} is longer than the {part} part of the text ({size} bytes, "
                             f"so at most {size} tokens); use a smaller --n-ctx or a longer text")
    with user_errors(ValueError, KeyError, prefix="invalid settings: "):
        config = TrainConfig(**{name: s[name] for name in (
            "steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip", "eval_every",
            "checkpoint_every", "seed", "repeat_frac", "random_repeat_frac", "min_repeat", "max_copies")})
        model_cfg = _model_config(s, s["vocab_size"], out.name)
    if out.is_dir() and any(out.iterdir()):
        others = foreign_files(out)
        if others:
            raise UsageError(f"--out {out} is not empty and holds files a training run does not write "
                             f"({', '.join(others[:3])}); choose a new or empty folder")
        if not overwrite:
            try:
                recorded, step = recorded_settings(out), checkpoint_step(out)
            except CheckpointError:  # a damaged run: it can only be replaced
                recorded, step = None, None
            same = recorded is not None and recorded.get("text_sha256") in (None, text_digest(text)) \
                and all(recorded.get(k, v) == v for k, v in s.items())
            hint = (f"it is a run of these settings at step {step}: add --resume to continue it, or "
                    if same and step is not None else "it holds a previous run: ")
            raise UsageError(f"--out {out} is not empty; {hint}add --overwrite to replace it, or choose "
                             "another folder")
    return model_cfg, config


def _model_config(s: dict, d_vocab: int, name: str):
    from ..models.presets import preset_config

    overrides = {} if s["init_range"] is None else {"init_range": s["init_range"]}
    if s["untied"]:
        overrides["tied_unembed"] = False
    return preset_config(s["arch"], d_model=s["d_model"], n_layers=s["layers"], n_heads=s["heads"],
                         d_vocab=d_vocab, n_ctx=s["n_ctx"], model_name=name, **overrides)


def _new_tokenizer(s: dict, scratch: str, train_text: str, heldout_text: str) -> tuple:
    """Train the tokenizer in the folder ``scratch`` and check that both parts hold ``n_ctx`` tokens."""
    from ..train import encode_text, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(train_text, s["vocab_size"], scratch)
    streams = []
    for part, piece in (("training", train_text), ("held-out", heldout_text)):
        with user_errors(ValueError, prefix=f"the {part} part of the text: "):
            stream = encode_text(piece, tokenizer)
        if len(stream) < s["n_ctx"]:
            raise UsageError(f"--n-ctx {s['n_ctx']} is longer than the {part} part of the text ({len(stream)} "
                             "tokens); use a smaller --n-ctx or a longer text")
        streams.append(stream)
    return tokenizer, *streams


def _start_folder(out: Path, settings: dict, text: str, tokenizer_dir: str, overwrite: bool) -> None:
    """The first writes of a new run: clear DIR (--overwrite), the settings, then the tokenizer."""
    from ..train.rundir import TOKENIZER_FILES, clear_run, install_files, write_settings

    if overwrite and out.is_dir():
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    write_settings(out, settings, text)
    install_files(tokenizer_dir, out, TOKENIZER_FILES)


def _new_trainer(args, out: Path, s: dict, model_cfg, config, tokenizer, train_stream, heldout_stream):
    from ..fs import open_log
    from ..train import Trainer, init_model
    from ..train.rundir import CHECKPOINT, LOG

    cfg = dataclasses.replace(model_cfg, d_vocab=len(tokenizer))
    model = init_model(cfg, s["seed"], tokenizer=tokenizer, device=args.device)
    log_file = open_log(out / LOG, fresh=True)
    return Trainer(model, train_stream, heldout_stream, tokenizer.eos_token_id, config,
                   checkpoint_dir=out / CHECKPOINT, log=_logger(log_file), progress=not args.no_progress)


def _resume(args, out: Path, given: dict, settings: dict, text: str) -> tuple:
    from ..fs import open_log
    from ..train import CheckpointError, Trainer, encode_text, load_tokenizer
    from ..train.rundir import CHECKPOINT, LOG, checkpoint_step, recorded_settings, text_digest, trim_log

    if args.overwrite:
        raise UsageError("--resume continues the run in --out and --overwrite replaces it; give one of them")
    with user_errors(CheckpointError):
        step = checkpoint_step(out) if out.is_dir() else None
        if step is None:
            raise UsageError(f"--resume: nothing to resume in {out} (no {CHECKPOINT}/ folder); "
                             "run without --resume to start a run there")
        recorded = recorded_settings(out)
    for name, value in given.items():
        if name in recorded and recorded[name] != value:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"--resume: {flag} {value} differs from the run's {recorded[name]} in {out}; leave "
                             f"{flag} out to keep it, or start a new run elsewhere (or with --overwrite)")
    if recorded.get("text_sha256") not in (None, text_digest(text)):
        raise UsageError(f"--resume: --text {args.text} is not the text the run in {out} was trained on "
                         "(its SHA-256 differs); give that text")
    train_text, heldout_text = _split(text, recorded.get("heldout_frac", settings["heldout_frac"]), args.text)
    with user_errors(FileNotFoundError, OSError, ValueError, prefix=f"--resume: the tokenizer in {out}: "):
        tokenizer = load_tokenizer(out)
    train_stream, heldout_stream = encode_text(train_text, tokenizer), encode_text(heldout_text, tokenizer)
    print(f"data: {len(train_stream):,} training tokens, {len(heldout_stream):,} held-out tokens")
    with user_errors(CheckpointError, ValueError, prefix="--resume: "):  # ValueError: a text too short
        trainer = Trainer.resume(out / CHECKPOINT, train_stream, heldout_stream, tokenizer.eos_token_id,
                                 tokenizer=tokenizer, device=args.device, progress=not args.no_progress)
    trim_log(out / LOG, trainer.step)
    trainer.log = _logger(open_log(out / LOG))
    print(f"resuming at step {trainer.step} of {trainer.config.steps}")
    return trainer, tokenizer, train_stream


def _logger(log_file):
    def log(record: dict) -> None:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    log.file = log_file
    return log


def _train_and_save(trainer, out: Path, tokenizer, train_stream, start: float) -> int:
    from ..train import unigram_loss
    from ..train.rundir import CHECKPOINT, SUMMARY, write_atomic
    from ..weights import save_pretrained

    trainer.run()
    trainer.log.file.close()
    if _gpt2_like(trainer.model.cfg):
        save_pretrained(trainer.model, out)
        where = f"model saved to {out}"
    else:
        where = f"weights in {out / CHECKPOINT} (glassbox.train.load_checkpoint; only gpt2 exports to transformers)"
    tokens_seen = trainer.step * trainer.config.batch_size * trainer.model.cfg.n_ctx
    summary = {"steps": trainer.step, "tokens_seen": tokens_seen,
               "heldout_loss": trainer.history["eval"][-1][1],
               "unigram_heldout_loss": unigram_loss(train_stream, trainer.heldout_stream, len(tokenizer)),
               "train_config": dataclasses.asdict(trainer.config), "model_config": trainer.model.cfg.to_dict()}
    write_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    print(f"held-out loss {summary['heldout_loss']:.4f} nats/token (unigram baseline "
          f"{summary['unigram_heldout_loss']:.4f}); {where} [{time.perf_counter() - start:.0f} s]")
    return 0


def _gpt2_like(cfg) -> bool:
    from ..models.presets import preset_config

    return cfg == preset_config("gpt2", d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, model_name=cfg.model_name,
                                init_range=cfg.init_range, tied_unembed=cfg.tied_unembed)
