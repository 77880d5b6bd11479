"""What demo, parity and attention share: loading ``--model``, checking ``--prompt``, ``--seed`` and
``--out``, each turning the mistakes a user can make into a one-line ``UsageError``.

Only the errors the loader and tokenizer raise on purpose for bad input (ValueError, a missing file,
a hub name that cannot be fetched) are converted; anything else is a bug and keeps its traceback.
"""

import argparse
import os
from pathlib import Path
from typing import Optional

from .errors import UsageError, user_errors
from .help_values import DEFAULT_MODEL

SEED_RANGE = (0, 2 ** 64 - 1)  # torch.manual_seed takes these (and negative ones, mapped onto them)


def seed_arg(value: str) -> int:
    """argparse ``type=`` for ``--seed``: an integer torch.manual_seed accepts."""
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {value!r}; give an integer such as 0") from None
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"seed {seed} is out of range; give an integer from 0 to 2**64 - 1")
    return seed


def text_arg(value: str) -> str:
    """argparse ``type=`` for text: the command line must have given valid UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = value[error.start:error.end]
        raise argparse.ArgumentTypeError(f"{value!r} holds bytes that are not UTF-8 ({bad!r}); "
                                         "give UTF-8 text") from None
    return value


def positive_int(value: str) -> int:
    """argparse ``type=`` for counts that must be at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {value!r}; give a whole number >= 1") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is not a count; give a whole number >= 1")
    return number


def load_model(name: str, device: Optional[str] = None, dtype=None, also_accepted: str = ""):
    """``HookedTransformer.from_pretrained(name)`` (in ``dtype``, default float32), with the user's
    mistakes as UsageError.

    ``also_accepted`` names values the command handles itself (e.g. "'random'"), for the message.
    """
    import torch

    from ..weights.pretrained import from_pretrained

    dtype = torch.float32 if dtype is None else dtype
    if name == "":
        raise UsageError(f"--model is empty; give {accepted_models(also_accepted)}")
    folder = model_folder(name, also_accepted)
    try:
        with user_errors(ValueError, prefix=f"--model {name!r}: "):
            return from_pretrained(folder, device=device, dtype=dtype)
    except FileNotFoundError as error:  # no config.json, or no weights file
        raise UsageError(f"--model {name!r}: {error}; a model folder holds config.json and model.safetensors, "
                         "as save_pretrained and glassbox train write them") from error


def accepted_models(also_accepted: str = "") -> str:
    from ..weights.pretrained import HUB_MODELS, shipped_models

    return (f"a model folder (config.json and weights, as save_pretrained and glassbox train write), a "
            f"shipped model ({', '.join(shipped_models()) or 'none'}), a hub name ({', '.join(HUB_MODELS)}) or "
            "a Hugging Face repo id ('org/name')"
            + (f" or {also_accepted}" if also_accepted else ""))


def model_folder(name: str, also_accepted: str = "") -> Path:
    from ..weights.pretrained import HUB_MODELS, SHIPPED_DIR, is_hub_repo_id, resolve

    accepted = accepted_models(also_accepted)
    path = Path(name).expanduser()
    if not path.is_dir() and not (SHIPPED_DIR / name).is_dir() and name not in HUB_MODELS and not is_hub_repo_id(name):
        if path.exists():
            raise UsageError(f"--model {name!r} is a file, not a model folder; give {accepted}")
        if "/" in name or "\\" in name or name.startswith((".", "~")):
            raise UsageError(f"--model {name!r}: no such folder; give {accepted}")
        from ..suggest import did_you_mean
        from ..weights.pretrained import known_model_names

        raise UsageError(f"--model {name!r} is not a known model{did_you_mean(name, known_model_names())}; "
                         f"give {accepted}")
    try:
        return resolve(name)
    except OSError as error:  # only hub names and repo ids get here: no network, or not in the cache
        raise UsageError(hub_failure(name, error.__cause__ or error)) from error


def hub_failure(name: str, cause: BaseException) -> str:
    from huggingface_hub.errors import LocalEntryNotFoundError

    from ..weights.pretrained import hub_cache_dir, hub_offline

    instead = f"pass a local model folder, or {DEFAULT_MODEL} (shipped with glassbox)"
    if isinstance(cause, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if hub_offline() else "the Hugging Face hub is unreachable"
        return (f"--model {name!r}: {why} and {name} is not in the local Hugging Face cache ({hub_cache_dir()}); "
                f"download it once with network access, or {instead}")
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return (f"--model {name!r}: could not fetch it from the Hugging Face hub ({type(cause).__name__}: {first}); "
            f"{instead}")


def tokenizer_of(model, name: str):
    """The model's tokenizer, or a UsageError saying that the folder has none."""
    try:
        return model.tokenizer
    except ValueError:
        raise UsageError(f"--model {name!r} has no tokenizer (no vocab.json or tokenizer.json in its folder, and "
                         f"its d_vocab={model.cfg.d_vocab} is not GPT-2's); this command reads text, so give a "
                         "folder with its tokenizer files") from None


def prompt_tokens(model, prompt: str, prepend_bos: Optional[bool] = None, flag: str = "--prompt"):
    """[1 pos] tokens of a prompt that is not empty and fits the model's context."""
    if prompt == "":
        raise UsageError(f"{flag} is empty; give some text")
    from ..models.tokenize import encode_text

    bos = model.cfg.default_prepend_bos if prepend_bos is None else prepend_bos
    try:
        n_tokens = len(encode_text(model.tokenizer, prompt, flag)) + int(bos)
    except ValueError as err:
        raise UsageError(str(err)) from err
    if n_tokens > model.cfg.n_ctx:
        raise UsageError(f"{flag} is {n_tokens} tokens{' (BOS included)' if bos else ''}, more than the "
                         f"{model.cfg.n_ctx} this model reads (n_ctx); give a shorter prompt")
    if n_tokens == 0:
        raise UsageError(f"{flag} {prompt!r} tokenizes to no tokens; give some text, or drop --no-bos")
    return model.to_tokens(prompt, prepend_bos=prepend_bos)


def output_folder(out: str) -> Path:
    """The folder ``--out`` names (new or existing), checked before any work; ``make_folder`` creates it."""
    if out == "":
        raise UsageError("--out is empty; give a folder to write into, e.g. glassbox-report")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out!r} is an existing file; give a folder (new or existing) to write into")
    _check_place(out, path)
    return path


def output_file(out: str) -> Path:
    """The file ``--out`` names (an existing file is replaced), checked before any work; ``write_output``
    writes it."""
    if out == "":
        raise UsageError("--out is empty; give a file name, e.g. attention.html")
    path = Path(out).expanduser()
    if path.is_dir():
        raise UsageError(f"--out {out!r} is a folder; give a file name, e.g. {str(path / 'attention.html')!r}")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"--out {out!r} is not writable; give a file you can write")
    _check_place(out, path.parent)
    return path


def _check_place(out: str, folder: Path) -> None:
    """``folder``, where the output goes, must be a writable folder or creatable inside one."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {out!r}: {str(existing)!r} is a file, not a folder; give a path in a folder")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"--out {out!r}: {str(existing)!r} is not writable; give a place you can write to")


def make_folder(path: Path, out: str) -> None:
    with user_errors(OSError, prefix=f"--out {out!r}: cannot create this folder: "):
        path.mkdir(parents=True, exist_ok=True)


def write_output(path: Path, out: str, text: str) -> None:
    from ..fs import write_text

    with user_errors(OSError, prefix=f"--out {out!r}: cannot write it: "):
        write_text(path, text)  # written whole (glassbox.fs): a failure leaves the old file
