"""Building glassbox models from Hugging Face GPT-2 weights, and exporting them back.

Names resolve in this order: a local folder; a model shipped inside the package; a hub name
(gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2) fetched or found in the local Hugging Face
cache by ``huggingface_hub`` (so ``HF_HUB_OFFLINE=1`` with a filled cache works). No weight
processing happens on load unless asked for (see ``processing.py``): our logits equal the HF model's.

A folder is checked before the model is built: config.json's fields (``checks.py``), then the
config against the weights' header (layer count, embedding sizes), then every tensor's shape. A
tokenizer with more tokens than the model's vocabulary is refused (one with fewer is fine: some
vocabularies are padded); a damaged tokenizer file is an error naming the folder. A folder that an
interrupted ``save_pretrained`` left renamed aside is put back first (``export.recover``).
Exporting (``to_hf``, ``save_pretrained``) lives in ``export.py``.
"""

from pathlib import Path
from typing import Optional, Union

import torch

from ..models import Config, HookedTransformer
from .architectures import architecture_of_type
from .checks import check_against_weights, check_config_fields
from .export import recover, save_pretrained, to_hf
from .files import PYTORCH_BIN, read_config, read_state_dict, weight_shapes, weights_file
from .gpt2 import config_from_hf
from .processing import ALL_STEPS, process

__all__ = ["DEFAULT_MODEL", "HUB_MODELS", "config_of", "from_hf", "from_pretrained", "hub_config", "load_folder",
           "resolve", "save_pretrained", "shipped_models", "to_hf"]

# Hub names -> (n_layer, n_embd, n_head); vocabulary 50257 and context 1024 for all of them.
HUB_MODELS = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
    "distilgpt2": (6, 768, 12),
}
HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "vocab.json", "merges.txt",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
# The model every command uses unless told otherwise: trained by glassbox, shipped in the package.
DEFAULT_MODEL = "glassbox-austen"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
TOKENIZER_FILES = ("vocab.json", "tokenizer.json")


def hub_config(name: str) -> Config:
    """The Config of a GPT-2 hub model, without downloading anything."""
    from transformers import GPT2Config

    if name not in HUB_MODELS:
        raise KeyError(f"unknown hub model {name!r}; known: {', '.join(HUB_MODELS)}")
    n_layer, n_embd, n_head = HUB_MODELS[name]
    return config_from_hf(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, name_or_path=name))


def shipped_models() -> list:
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) if SHIPPED_DIR.is_dir() else []


def resolve(name_or_path: Union[str, Path]) -> Path:
    """The local folder holding a model's config.json and weights."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (not path.exists() and recover(path)):
        return path
    name = str(name_or_path)
    if (SHIPPED_DIR / name).is_dir():
        return SHIPPED_DIR / name
    if name in HUB_MODELS:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(name, allow_patterns=HUB_FILES))
        except Exception as err:
            raise OSError(
                f"could not fetch {name!r} from the Hugging Face hub or find it in the local cache "
                f"({type(err).__name__}: {err}). Download it once with network access, or pass a local folder."
            ) from err
    raise ValueError(f"{name!r} is neither a folder, a shipped model ({', '.join(shipped_models()) or 'none'}) "
                     f"nor a known hub name ({', '.join(HUB_MODELS)})")


def from_pretrained(name_or_path, device=None, dtype: torch.dtype = torch.float32, tokenizer=None,
                    **kwargs) -> HookedTransformer:
    """Load a model; weight processing (``fold_ln``, ``center_reader_weights``, ``center_writing_weights``,
    ``center_unembed``, ``fold_value_biases``, ``refactor_factored_attn_matrices``, all False by default)
    is opt-in and recorded on ``model.processing``."""
    folder = resolve(name_or_path)
    steps = {step: bool(kwargs.pop(step)) for step in ALL_STEPS if step in kwargs}
    if kwargs:
        raise TypeError(f"unexpected options for from_pretrained: {', '.join(kwargs)}; weight processing "
                        f"options are {', '.join(ALL_STEPS)}")
    model = load_folder(folder, device=device, dtype=dtype, tokenizer=tokenizer)
    return process(model, **steps) if any(steps.values()) else model


def config_of(name_or_path) -> Config:
    """The Config of a model ``from_pretrained`` can load, without reading (or downloading) its weights:
    a hub name's from its sizes, a folder's (or shipped model's) from its config.json."""
    if str(name_or_path) in HUB_MODELS and not Path(str(name_or_path)).expanduser().is_dir():
        return hub_config(str(name_or_path)).replace(model_name=str(name_or_path))
    folder = resolve(name_or_path)
    hf_config, model_type, arch = _folder_config(folder)
    return _config_from(arch, hf_config, folder)


def _folder_config(folder: Path) -> tuple:
    """(hf_config, model_type, architecture) of a folder, its config.json's fields checked."""
    import transformers

    config = read_config(folder)
    source = str(folder / "config.json")
    model_type = config.get("model_type")
    arch = architecture_of_type(model_type, source=source)
    check_config_fields(config, arch.config_fields, source)
    try:
        hf_config = getattr(transformers, arch.hf_config_class).from_dict(config)
    except Exception as err:  # transformers validates some fields itself, with its own error types
        raise ValueError(f"{source}: transformers refused the config ({type(err).__name__}: {err})") from err
    return hf_config, model_type, arch


def _config_from(arch, hf_config, folder: Path) -> Config:
    try:
        return arch.config_from(hf_config).replace(model_name=folder.name)
    except ValueError as err:
        raise ValueError(f"{folder / 'config.json'}: {err}") from err


def load_folder(folder: Path, device=None, dtype: torch.dtype = torch.float32,
                tokenizer=None) -> HookedTransformer:
    """A Hugging Face GPT-2, Llama or GPT-J folder -> HookedTransformer; errors name the file or tensor."""
    folder = Path(folder)
    source = str(folder / "config.json")
    hf_config, model_type, arch = _folder_config(folder)
    weights = weights_file(folder)
    # A PyTorch checkpoint has no header to read shapes from: it is read once, here.
    tensors = read_state_dict(folder) if weights.name == PYTORCH_BIN else None
    shapes = {k: tuple(v.shape) for k, v in tensors.items()} if tensors is not None else weight_shapes(folder)
    check_against_weights(hf_config, arch.weight_layout, shapes, source, str(weights))
    cfg = _config_from(arch, hf_config, folder)
    state = arch.to_glassbox(tensors if tensors is not None else read_state_dict(folder), cfg, source=str(weights))
    tokenizer_source = "the tokenizer= argument"
    if tokenizer is None and any((folder / f).is_file() for f in TOKENIZER_FILES):
        tokenizer, tokenizer_source = load_tokenizer(folder), f"saved in {folder}"
    return build(cfg, state, tokenizer, device, dtype, tokenizer_source)


def load_tokenizer(folder: Path):
    """The tokenizer saved in ``folder``; a damaged file is an error naming the folder and its files."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # tokenizers and transformers raise many types for damaged files
        files = ", ".join(sorted(p.name for p in Path(folder).iterdir() if p.name in TOKENIZER_FILES + (
            "merges.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")))
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"could not load the tokenizer in {folder} (files: {files}): {type(err).__name__}: "
                         f"{first[:300]}; repair or remove the damaged tokenizer files") from err


def check_tokenizer(tokenizer, cfg: Config, source: str) -> None:
    """A tokenizer may not produce ids the model has no embedding for."""
    if tokenizer is None:
        return
    try:
        size = len(tokenizer)
    except TypeError:
        return  # not a sized tokenizer: nothing to compare
    if size > cfg.d_vocab:
        raise ValueError(f"the tokenizer ({source}) has {size} tokens but the model's vocabulary has "
                         f"d_vocab={cfg.d_vocab}: ids {cfg.d_vocab}..{size - 1} would have no embedding. Pass the "
                         "model's own tokenizer (a smaller one is fine)")


def build(cfg: Config, state: dict, tokenizer, device, dtype,
          tokenizer_source: str = "the tokenizer= argument") -> HookedTransformer:
    check_tokenizer(tokenizer, cfg, tokenizer_source)
    model = HookedTransformer(cfg, tokenizer=tokenizer, init=False, device=device, dtype=dtype)
    model.load_state_dict(state, strict=True)
    return model.eval()


def from_hf(hf_model, tokenizer=None, device=None, dtype: Optional[torch.dtype] = None) -> HookedTransformer:
    """An in-memory ``transformers`` GPT-2, Llama or GPT-J -> HookedTransformer with the same weights."""
    arch = architecture_of_type(getattr(hf_model.config, "model_type", None), source=type(hf_model).__name__)
    cfg = arch.config_from(hf_model.config)
    state = arch.to_glassbox(hf_model.state_dict(), cfg)
    first = next(hf_model.parameters())
    return build(cfg, state, tokenizer, device or first.device, dtype or first.dtype)
