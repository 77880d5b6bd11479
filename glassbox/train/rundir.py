"""The output folder of a training run (``glassbox train --out DIR``) and what it already holds.

A run folder holds only files the trainer writes (``RUN_FILES``): the Hugging Face export, the
tokenizer, ``checkpoint/`` (and the leftovers of an interrupted save, see ``checkpoint``), the log,
the summary and ``train_settings.json``: the run's settings and the SHA-256 of its text, written
before anything else, so that ``--resume`` can refuse other settings or another text.

``clear_run`` deletes only those files (and glassbox's record and leftovers); a folder holding
anything else is never cleared. Files are replaced whole (``glassbox.fs``), so a killed process
leaves the old or the new file, not a mix.
"""

import hashlib
import json
from pathlib import Path
from typing import Optional, Union

from ..fs import JOURNAL, RECORD, TMP_PREFIX, remove_entries, write_bytes, write_text
from .checkpoint import CheckpointError, load_checkpoint, recover_checkpoint

CHECKPOINT, LOG, SUMMARY, SETTINGS = "checkpoint", "train_log.jsonl", "train_summary.json", "train_settings.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
RUN_FILES = frozenset({
    CHECKPOINT, *(CHECKPOINT + suffix for suffix in (".tmp", ".new", ".old")), LOG, SUMMARY, SETTINGS,
    *TOKENIZER_FILES, "tokenizer.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "config.json", "generation_config.json", "model.safetensors", RECORD, JOURNAL})
# The settings a run's checkpoint records, for runs written before train_settings.json existed.
TRAIN_FIELDS = ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip", "eval_every",
                "checkpoint_every", "seed", "repeat_frac", "random_repeat_frac", "min_repeat", "max_copies")
MODEL_FIELDS = {"layers": "n_layers", "d_model": "d_model", "heads": "n_heads", "n_ctx": "n_ctx",
                "init_range": "init_range"}


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_atomic(path: Path, data: str) -> None:
    """Replace ``path`` whole: a killed process leaves the old file or the new one (``glassbox.fs``)."""
    write_text(path, data)


def foreign_files(folder: Path) -> list:
    """The names in ``folder`` that no training run writes (sorted)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in RUN_FILES and not p.name.endswith(".writing")
                  and not p.name.startswith(TMP_PREFIX))


def clear_run(folder: Path) -> None:
    """Delete what a previous run wrote in ``folder``; refuses a folder holding anything else."""
    others = foreign_files(folder)
    if others:
        raise ValueError(f"{folder} holds files a training run does not write: {', '.join(others[:3])}")
    remove_entries(folder, sorted(p.name for p in folder.iterdir()))


def write_settings(folder: Path, settings: dict, text: str) -> None:
    record = {"settings": settings, "text_sha256": text_digest(text), "text_chars": len(text)}
    write_atomic(folder / SETTINGS, json.dumps(record, indent=2, sort_keys=True) + "\n")


def recorded_settings(folder: Path) -> Optional[dict]:
    """The run's settings: train_settings.json, else what its checkpoint records; None if neither.

    The result's ``text_sha256`` is None when only the checkpoint was there to read.
    """
    path = folder / SETTINGS
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return {**record["settings"], "text_sha256": record["text_sha256"]}
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise CheckpointError(f"damaged run settings file {path}: {error}") from error
    if not recover_checkpoint(folder / CHECKPOINT):
        return None
    cfg, _, state = load_checkpoint(folder / CHECKPOINT)
    train = state["train_config"] if isinstance(state["train_config"], dict) else {}
    settings = {name: train[name] for name in TRAIN_FIELDS if name in train}
    settings.update({name: getattr(cfg, field) for name, field in MODEL_FIELDS.items()})
    settings["untied"] = not cfg.tied_unembed
    return {**settings, "text_sha256": None}


def checkpoint_step(folder: Path) -> Optional[int]:
    """The step of the run's checkpoint (completing an interrupted save first), or None."""
    if not recover_checkpoint(folder / CHECKPOINT):
        return None
    return int(load_checkpoint(folder / CHECKPOINT)[2]["step"])


def trim_log(path: Path, step: int) -> None:
    """Keep the log's records up to ``step``: those after the checkpoint are trained again."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the half-written last line of a killed run
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
            kept.append(line + "\n")
    write_atomic(path, "".join(kept))


def install_files(source: Union[str, Path], folder: Path, names) -> None:
    """Copy ``names`` from ``source`` into ``folder``, each replaced whole."""
    for name in names:
        write_bytes(folder / name, (Path(source) / name).read_bytes())
