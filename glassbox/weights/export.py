"""Exporting glassbox models to ``transformers``: ``to_hf`` in memory, ``save_pretrained`` to a folder.

``to_hf`` returns a model whose tensors are its own: editing or fine-tuning the export never
changes the glassbox model. ``share_memory=True`` skips the copy (half the memory): then every
tensor whose layout the two models share is the same storage, and an edit to one shows in the
other; tensors that must be rearranged are copies either way (GPT-2's fused ``c_attn`` weight and
bias; the other families' transposed projections), so the export is not a full view of the model.

``save_pretrained`` writes through ``glassbox.fs.FolderWriter``: the new model's files are written
under temporary names inside the folder, flushed, and renamed into place after a journal, so a
failure or a kill leaves the old model or the new one (the next glassbox load or save finishes an
interrupted commit; ``transformers`` reading the folder before then can see a mix). The folder is
written in place: files that are not glassbox's (a README, notes, a training log, ``figures/``,
a ``model-backup.safetensors``) are never moved, copied or deleted. Of the previous model's files,
only those the folder's record ``.glassbox-files.json`` lists are removed when the new model lacks
them (a folder saved before records existed: the standard model file names, ``MODEL_FILES``, and the
shards its index names). A folder an earlier version's two-rename swap left aside is put back.
"""

import errno
import json
import os
from pathlib import Path

import torch

from ..fs import FolderWriter
from ..fs import recover as recover_folder
from ..fs.legacy import recover_export_siblings
from ..models import HookedTransformer
from .architectures import architecture_of_config

OWNER = "model"
# The files of a model folder an earlier glassbox wrote (with the shards its index names).
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
    load, replacing the model files of any model already there and keeping the folder's other files (see
    the module docstring)."""
    folder = Path(os.path.abspath(folder))  # normalised: "..", "." and "a/../b" name their real folder
    if folder.is_symlink():  # write into the folder the link points to, and keep the link
        folder = folder.resolve()
    if folder == folder.parent:
        raise ValueError(f"save_pretrained: cannot write into the root folder {folder}")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"save_pretrained: {folder} exists and is not a folder", str(folder))
    recover(folder)
    hf_model = to_hf(model, share_memory=True)  # only written, never edited: no copy needed
    tokenizer = model.tokenizer if (model._tokenizer is not None or model.cfg.d_vocab == 50257) else None
    with FolderWriter(folder, OWNER, adopt=previous_model_files(folder)) as writer:
        writer.write_tree(lambda tmp: _write(hf_model, tokenizer, tmp))


def recover(folder) -> bool:
    """Finish or undo what an interrupted ``save_pretrained`` left: a commit of this version
    (``glassbox.fs.recover``), or a folder an earlier version renamed aside (put back). True if a
    folder is there afterwards."""
    folder = Path(os.path.abspath(folder))
    recover_export_siblings(folder)
    recover_folder(folder)
    return folder.is_dir()


def previous_model_files(folder: Path) -> list:
    """The files of a model folder that glassbox wrote without its record (an earlier version): the
    model files' own names and the shards its index files name, nothing that merely looks like one."""
    names = set(MODEL_FILES)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if not (folder / index).is_file():
            continue
        try:
            weight_map = json.loads((folder / index).read_text(encoding="utf-8")).get("weight_map")
        except (ValueError, AttributeError, UnicodeDecodeError):
            continue  # a damaged index: none of its shards is taken to be glassbox's
        if isinstance(weight_map, dict):
            names.update(v for v in weight_map.values() if isinstance(v, str) and v and "/" not in v
                         and "\\" not in v and v not in (".", "..") and not v.startswith(".glassbox-"))
    return sorted(names)


# -- a module function, so that a test can make it fail ------------------------------------------
def _write(hf_model, tokenizer, tmp: Path) -> None:
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Writing model shards" bar; the caller shows its own progress
    try:
        hf_model.save_pretrained(str(tmp))
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
        # transformers 5 writes only tokenizer.json; GPT-2's own vocab.json and merges.txt are what
        # older readers and the slow GPT2Tokenizer need, so a BPE tokenizer writes them too.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and type(backend.model).__name__ == "BPE":
            backend.model.save(str(tmp))
