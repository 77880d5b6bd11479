"""Exporting glassbox models to ``transformers``: ``to_hf`` in memory, ``save_pretrained`` to a folder.

``to_hf`` returns a model whose tensors are its own: editing or fine-tuning the export never
changes the glassbox model. ``share_memory=True`` skips the copy (half the memory): then every
tensor whose layout the two models share is the same storage, and an edit to one shows in the
other; tensors that must be rearranged are copies either way (GPT-2's fused ``c_attn`` weight and
bias; the other families' transposed projections), so the export is not a full view of the model.

``save_pretrained`` never leaves a folder that mixes two models. It writes the whole new folder
as a temporary sibling (``NAME.glassbox-tmp-XXXX``), flushes it to disk, then swaps: the old folder
is renamed aside (``NAME.glassbox-old-XXXX``), the new one renamed into place, the old one removed.
Files in the old folder that are not part of a model (a training log, a checkpoint directory)
are carried into the new one as hard links. If anything fails, the temporary sibling is removed and
the old folder put back; if even that rename fails, the folder is briefly absent and the next load
or save renames the old folder back (``recover``), so a reader sees the old model or the new one,
never a mix. A save also removes temporary siblings that an interrupted save left behind. A
process whose working directory is the folder is moved into the new one.
"""

import os
import shutil
import uuid
from pathlib import Path
from typing import Optional

import torch

from ..models import HookedTransformer
from .architectures import architecture_of_config

TMP_TAG, OLD_TAG = ".glassbox-tmp-", ".glassbox-old-"
# Files that belong to a model folder; anything else in a folder being replaced is carried over.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model.bin.index.json", "vocab.json", "merges.txt", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
               "chat_template.jinja", "chat_template.json")


def to_hf(model: HookedTransformer, share_memory: bool = False):
    """HookedTransformer -> the ``transformers`` class of the first family in ``ARCHITECTURES`` that can
    represent the config (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2/Qwen3, Gemma
    1/2/3, GPTNeoXForCausalLM, Olmo2ForCausalLM, GPTJForCausalLM; eager attention) with the same weights, in tensors of its
    own unless ``share_memory`` (see the module docstring)."""
    import transformers

    arch = _architecture_of(model)
    hf_config = arch.config_to(model.cfg)
    hf_config._attn_implementation = "eager"
    hf_class = getattr(transformers, arch.hf_model_class)
    first = next(model.parameters())
    ours = model.state_dict()
    if not share_memory:
        ours = {name: t.detach().clone() for name, t in ours.items()}
    state = arch.to_hf(ours, model.cfg)
    if arch.model_type != "gpt2":
        # Built for real: their rotary tables are non-persistent buffers that a meta build would lack.
        hf_model = hf_class(hf_config).to(first.dtype)
        if share_memory:
            hf_model.load_state_dict(state, strict=True, assign=True)
            if model.cfg.tied_unembed:
                hf_model.tie_weights()
        else:
            hf_model.load_state_dict(state, strict=True)
        return hf_model.to(first.device).eval()
    with torch.device("meta"):
        hf_model = hf_class(hf_config)
    hf_model.load_state_dict(state, strict=False, assign=True)
    if model.cfg.tied_unembed:
        hf_model.tie_weights()
    return hf_model.to(first.device).eval()


def _architecture_of(model: HookedTransformer):
    """``architecture_of_config``, with the refusal of a model that only fold_ln made unexportable
    naming the unembedding bias it added (ln_final's bias folded into b_U), not the architecture."""
    try:
        return architecture_of_config(model.cfg)
    except ValueError as err:
        if "fold_ln" not in model.processing or not model.cfg.unembed_bias:
            raise
        try:
            arch = architecture_of_config(model.cfg.replace(unembed_bias=False))
        except ValueError:
            raise err from None
        raise ValueError(f"this model was loaded with fold_ln, which folds ln_final's bias into an unembedding bias "
                         f"b_U (Config.unembed_bias=True), and {arch.model_type} ({arch.hf_model_class}) has no "
                         "unembedding bias to hold it: export the model loaded without fold_ln (and fold after "
                         "loading the exported folder)") from err


def save_pretrained(model: HookedTransformer, folder) -> None:
    """Write a Hugging Face folder (of any family ``to_hf`` exports) that ``transformers`` and glassbox both
    load, replacing any model already there in one swap (see the module docstring)."""
    folder = Path(os.path.abspath(folder))  # normalised: "..", "." and "a/../b" name their real folder
    if folder.is_symlink():  # replace the folder the link points to, and keep the link
        folder = folder.resolve()
    if folder == folder.parent:
        raise ValueError(f"save_pretrained: cannot replace the root folder {folder}")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"save_pretrained: {folder} exists and is not a folder")
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover(folder, clean=True)
    hf_model = to_hf(model, share_memory=True)  # only written, never edited: no copy needed
    tokenizer = model.tokenizer if (model._tokenizer is not None or model.cfg.d_vocab == 50257) else None
    # os.mkdir (not mkdtemp, which makes it private to the user): the folder gets the usual permissions,
    # or those of the folder it replaces.
    tmp = folder.parent / f"{folder.name}{TMP_TAG}{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if folder.is_dir():
            shutil.copymode(folder, tmp)
        _write(hf_model, tokenizer, tmp)
        if folder.is_dir():
            _carry_over(folder, tmp)
        _sync(tmp)
    except BaseException:
        _remove(tmp, ignore_errors=True)
        raise
    if not folder.exists():
        try:
            _rename(tmp, folder)
        except BaseException:
            _remove(tmp, ignore_errors=True)
            raise
        _sync_dir(folder.parent)
        return
    old = folder.parent / f"{folder.name}{OLD_TAG}{uuid.uuid4().hex[:8]}"
    cwd = _cwd_inside(folder)
    try:
        _rename(folder, old)
    except BaseException:
        _remove(tmp, ignore_errors=True)
        raise
    try:
        _rename(tmp, folder)
    except BaseException:
        try:
            _rename(old, folder)  # the old model back in place
        except BaseException:
            pass  # the folder is absent: recover() on the next load or save renames the old one back
        _remove(tmp, ignore_errors=True)
        raise
    _sync_dir(folder.parent)
    if cwd is not None:  # the process stood in the old folder: move it to the same path in the new one
        try:
            os.chdir(cwd)
        except OSError:
            os.chdir(folder)
    _remove(old, ignore_errors=True)  # a leftover is removed by the next save


def recover(folder: Path, clean: bool = False) -> Optional[Path]:
    """Undo what an interrupted ``save_pretrained`` left: if ``folder`` is missing but an old copy
    was renamed aside, rename it back (the old model). With ``clean``, also remove temporary and
    old siblings that are no longer needed. Returns the folder restored, if any."""
    folder = Path(os.path.abspath(folder))
    parent = folder.parent
    try:
        olds = sorted((p for p in parent.iterdir() if p.name.startswith(folder.name + OLD_TAG) and p.is_dir()),
                      key=lambda p: p.stat().st_mtime)
    except OSError:  # no parent folder, or one that cannot be listed: nothing to recover
        return None
    restored = None
    if not folder.exists() and olds:
        _rename(olds[-1], folder)
        restored, olds = folder, olds[:-1]
    if clean:
        for p in olds + [p for p in parent.iterdir() if p.name.startswith(folder.name + TMP_TAG)]:
            _remove(p, ignore_errors=True)
    return restored


def _cwd_inside(folder: Path) -> Optional[str]:
    """The working directory, if it is ``folder`` or inside it (a rename would carry it away)."""
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    return cwd if cwd == str(folder) or cwd.startswith(str(folder) + os.sep) else None


# -- the steps, as module functions so that a test can make any one of them fail --------------------
def _write(hf_model, tokenizer, tmp: Path) -> None:
    hf_model.save_pretrained(str(tmp))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
        # transformers 5 writes only tokenizer.json; GPT-2's own vocab.json and merges.txt are what
        # older readers and the slow GPT2Tokenizer need, so a BPE tokenizer writes them too.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and type(backend.model).__name__ == "BPE":
            backend.model.save(str(tmp))


def _carry_over(folder: Path, tmp: Path) -> None:
    """Hard-link (or copy) every non-model file of ``folder`` into ``tmp``."""
    for entry in folder.iterdir():
        target = tmp / entry.name
        if entry.name in MODEL_FILES or _is_shard(entry.name) or target.exists():
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, target)


def _is_shard(name: str) -> bool:
    return (name.startswith("model-") and name.endswith(".safetensors")) or \
        (name.startswith("pytorch_model-") and name.endswith(".bin"))


def _link_or_copy(src, dst) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _sync(tmp: Path) -> None:
    """Flush every file written into ``tmp`` to disk, so the swap never publishes unwritten data."""
    for path in tmp.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _sync_dir(tmp)


def _sync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)


def _remove(path: Path, ignore_errors: bool = False) -> None:
    shutil.rmtree(path, ignore_errors=ignore_errors)
