"""Building glassbox models from Hugging Face folders and repo ids, and exporting them back.

Names resolve in this order: a local folder; a model shipped inside the package; a Hugging Face repo
id ("org/name" or a bare name such as "gpt2"), found in the local Hugging Face cache or fetched from
the hub by ``huggingface_hub``. The cache folder and offline mode are read from the environment at
each call (``HF_HUB_CACHE``, then ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``/hub, ``XDG_CACHE_HOME``; and
``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``), not only when ``huggingface_hub`` was imported, so
``HF_HUB_OFFLINE=1`` with a filled cache never touches the network. A repo id neither cached nor
fetchable is an error naming it and the cache folder searched. The architecture comes from
config.json's ``model_type``, else from the model class in its ``architectures``; one glassbox cannot
build is refused naming both; a config.json of TransformerLens's own fields (no model_type) with a
``*final.pth`` state dict is read by ``tl_format.py``. No weight processing happens on load unless asked for (see
``processing.py``): our logits equal the HF model's.

``dtype`` is a floating torch dtype, its name ("float32", "float16", "bfloat16", "float64"), or
"auto": config.json's ``dtype`` (transformers 5) or ``torch_dtype`` (older), else the dtype most of
the weights are stored in, else float32.

A folder is checked before the model is built: config.json's fields (``checks.py``), then the
config against the weights' header (layer count, embedding sizes), then every tensor's shape. A
tokenizer with more tokens than the model's vocabulary is refused (one with fewer is fine: some
vocabularies are padded); a damaged tokenizer file is an error naming the folder. A folder that an
interrupted ``save_pretrained`` left is finished first, and one an earlier version left renamed aside is
put back (``export.recover``), so a load never sees two models mixed.
Exporting (``to_hf``, ``save_pretrained``) lives in ``export.py``.
"""

import os
from pathlib import Path
from typing import Optional, Union

import torch

from ..models import Config, HookedTransformer
from ..models.devices import check_device, requested_map
from ..suggest import did_you_mean
from . import tl_format
from .architectures import ARCHITECTURES, architecture_of_type
from .checkpoints import cached_revisions
from .checks import check_against_weights, check_config_fields, check_rope_fields
from .export import recover, save_pretrained, to_hf
from .family import resolve_tying
from .files import PYTORCH_BIN, is_regular, read_config, read_state_dict, stored_dtype, weight_shapes, weights_file
from .gpt2 import config_from_hf
from .layer_types import MISTRAL_WITH_LAYER_TYPES
from .processing import ALL_STEPS, process

__all__ = ["DEFAULT_MODEL", "HUB_MODELS", "ModelNotFoundError", "as_dtype", "config_of", "from_hf", "from_pretrained",
           "hub_cache_dir", "hub_config", "is_hub_repo_id", "load_folder", "resolve", "save_pretrained",
           "shipped_models", "to_hf"]

# Hub names -> (n_layer, n_embd, n_head); vocabulary 50257 and context 1024 for all of them.
HUB_MODELS = {
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
    "distilgpt2": (6, 768, 12),
}
HUB_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "vocab.json", "merges.txt",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
             "added_tokens.json", "*" + tl_format.FINAL]  # the last: TransformerLens's own format (tl_format.py)
# The model every command uses unless told otherwise: trained by glassbox, shipped in the package.
DEFAULT_MODEL = "glassbox-austen"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
TOKENIZER_FILES = ("vocab.json", "tokenizer.json")
TOKENIZER_EXTRAS = ("merges.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "tokenizer.model")


def hub_config(name: str) -> Config:
    """The Config of a GPT-2 hub model, without downloading anything."""
    from transformers import GPT2Config

    if name not in HUB_MODELS:
        raise KeyError(f"unknown hub model {name!r}{did_you_mean(name, HUB_MODELS)}; known: {', '.join(HUB_MODELS)}")
    n_layer, n_embd, n_head = HUB_MODELS[name]
    return config_from_hf(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, name_or_path=name))


def shipped_models() -> list:
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) if SHIPPED_DIR.is_dir() else []


class ModelNotFoundError(OSError, ValueError):
    """A name that is no folder, no shipped model, and a repo id neither in the local Hugging Face
    cache nor fetchable from the hub (its ``__cause__`` is huggingface_hub's own error)."""


def resolve(name_or_path: Union[str, Path], files=None, revision: Optional[str] = None) -> Path:
    """The local folder holding a model's config.json and weights: a folder, a shipped model, or the
    snapshot of a Hugging Face repo id (cached, else fetched: ``files`` are the file patterns fetched,
    by default the config, weights and tokenizer; ``revision`` a branch, tag or commit of the repo, by
    default main). An empty or blank name is refused: Path("") is the working directory, which would
    load whatever model sits there."""
    check_name(name_or_path)
    check_revision(name_or_path, revision)
    path = Path(name_or_path).expanduser()
    if (path.is_dir() or not path.exists()) and recover(path):  # an interrupted save finished first
        return path
    name = str(name_or_path)
    if (SHIPPED_DIR / name).is_dir():
        return SHIPPED_DIR / name
    if path.exists():
        raise ValueError(f"{name!r} is a file, not a model folder (a folder holds config.json and the weights)")
    if _is_repo_id(name):
        return hub_snapshot(name, HUB_FILES if files is None else files, revision)
    raise ValueError(f"{name!r} is neither a folder, a shipped model ({', '.join(shipped_models()) or 'none'}) "
                     "nor a Hugging Face repo id ('org/name' or a bare name such as gpt2)"
                     + did_you_mean(name, known_model_names()))


def check_name(name_or_path) -> None:
    """A model name is a non-blank str or an os.PathLike (TypeError / ValueError naming it otherwise)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model name must be a str or a path, got {type(name_or_path).__name__} ({name_or_path!r})")
    if isinstance(name_or_path, str) and not name_or_path.strip():
        raise ValueError(f"model name is empty (got {name_or_path!r}): give a folder, a shipped model "
                         f"({', '.join(shipped_models()) or 'none'}) or a Hugging Face repo id; '.' names the "
                         "working directory")


def _is_repo_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return not name.startswith(("/", "~")) and not name.endswith(".")


def is_hub_repo_id(name: str) -> bool:
    """Whether ``name`` names a Hugging Face repo without asking the hub: an "org/name" repo id, or a
    bare one whose snapshot is in the local cache."""
    if not _is_repo_id(name):
        return False
    return "/" in name or (hub_cache_dir() / ("models--" + name) / "snapshots").is_dir()


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now (``huggingface_hub`` reads it
    once, at import): ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``/hub,
    ``XDG_CACHE_HOME``/huggingface/hub, else huggingface_hub's own setting."""
    import huggingface_hub.constants as hub

    def expand(value: str) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(value)))

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return expand(os.environ[var])
    if os.environ.get("HF_HOME"):
        return expand(os.environ["HF_HOME"]) / "hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return expand(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"
    return Path(hub.HF_HUB_CACHE)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set now, or when huggingface_hub was imported."""
    import huggingface_hub.constants as hub

    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return now.strip().upper() in ("1", "ON", "YES", "TRUE") or bool(hub.HF_HUB_OFFLINE)


def check_revision(name_or_path, revision) -> None:
    """``revision`` is None or a non-blank str, and only for a repo id (a folder has no revisions)."""
    if revision is None:
        return
    if not isinstance(revision, str) or not revision.strip():
        raise (TypeError if not isinstance(revision, str) else ValueError)(
            f"revision must be a non-empty str (a branch, tag or commit of the repo), got {revision!r}")
    name = str(name_or_path)
    if Path(name).expanduser().exists() or (SHIPPED_DIR / name).is_dir() or not _is_repo_id(name):
        raise ValueError(f"revision={revision!r} names a revision of a Hugging Face repo, but {name!r} is a "
                         "local folder or shipped model, which has one version")


def hub_snapshot(repo_id: str, files, revision: Optional[str] = None) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` (default main) in the hub cache: the cached
    one when offline (or when the hub cannot be reached), else fetched. ModelNotFoundError naming the
    repo id, the revision and the cache folder otherwise. A repo with no safetensors gets its
    pytorch_model.bin."""
    from huggingface_hub import snapshot_download

    cache, offline = hub_cache_dir(), hub_offline()
    at = {} if revision is None else {"revision": revision}
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=list(files), cache_dir=str(cache),
                                        local_files_only=offline, **at))
        if not offline and "*.safetensors" in files and not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=list(files) + [PYTORCH_BIN],
                                            cache_dir=str(cache), local_files_only=False, **at))
    except Exception as err:  # huggingface_hub raises many types: offline, unreachable, no such repo, gated
        raise ModelNotFoundError(_not_found(repo_id, cache, offline, err, revision)) from err
    return folder


def _not_found(repo_id: str, cache: Path, offline: bool, err: Exception, revision: Optional[str] = None) -> str:
    kinds = {cls.__name__ for cls in type(err).__mro__}
    first = (str(err).strip().splitlines() or [""])[0][:300]
    cached = cached_revisions(repo_id, cache)
    if revision is not None and cached and revision not in cached and not _is_cached_commit(repo_id, cache, revision):
        shown = cached if len(cached) <= 12 else cached[:6] + ["..."] + cached[-5:]
        return (f"revision {revision!r} of {repo_id!r} is not in the local Hugging Face cache {cache} "
                f"({len(cached)} revisions cached: {', '.join(shown)})"
                + ("; HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so the hub was not asked" if offline else
                   f", and the hub could not give it ({type(err).__name__}: {first})")
                + did_you_mean(revision, cached))
    if "IncompleteSnapshotError" in kinds:
        why = f"its cached snapshot is incomplete ({first})"
    elif offline:
        why = "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so the hub was not asked"
    elif "GatedRepoError" in kinds:
        why = f"the hub says the repo is gated: accept its terms and log in (hf auth login) ({first})"
    elif "RepositoryNotFoundError" in kinds:
        why = f"the hub has no such repo, or it is private and you are not logged in ({first})"
    elif "LocalEntryNotFoundError" in kinds:
        why = f"the hub could not be reached ({first})"
    else:
        why = f"{type(err).__name__}: {first}"
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    if revision is not None:
        why += f" (asked for revision {revision!r})"
    return (f"{repo_id!r} is neither a folder, a shipped model ({', '.join(shipped_models()) or 'none'}) nor a "
            f"repo id in the local Hugging Face cache (searched {folder}, in the cache {cache}), and glassbox "
            f"could not fetch {repo_id!r} from the Hugging Face hub: {why}. Download it once with network "
            "access, set HF_HUB_CACHE to the cache that holds it, or pass a local folder"
            + did_you_mean(repo_id, known_model_names(cache)))


def _is_cached_commit(repo_id: str, cache: Path, revision: str) -> bool:
    return (cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / revision).is_dir()


def known_model_names(cache: Optional[Path] = None) -> list:
    """The names ``from_pretrained`` takes without a folder or the hub: shipped models, the GPT-2 hub
    names, and the repo ids in the local Hugging Face cache (``cache``, default ``hub_cache_dir()``)."""
    cache = hub_cache_dir() if cache is None else cache
    try:
        cached = [p.name[len("models--"):].replace("--", "/") for p in cache.glob("models--*") if p.is_dir()]
    except OSError:  # an unreadable cache: no names from it
        cached = []
    return [*shipped_models(), *HUB_MODELS, *sorted(cached)]


DTYPE_NAMES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
               "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64}


def as_dtype(dtype, argument: str = "dtype") -> Optional[torch.dtype]:
    """A floating torch dtype from a dtype or its name ("float16", "torch.bfloat16", ...); None for
    None and "auto". Anything else is a ValueError naming ``argument``."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.removeprefix("torch.")]
    if isinstance(dtype, torch.dtype) and dtype in DTYPE_NAMES.values():
        return dtype
    raise ValueError(f"{argument}={dtype!r} is not a dtype glassbox computes in; give torch.float32, torch.float16, "
                     "torch.bfloat16, torch.float64, one of their names, or 'auto'")


def auto_dtype(config: dict, folder: Path, tensors: Optional[dict] = None) -> torch.dtype:
    """``dtype="auto"``: config.json's ``dtype`` (transformers 5) or ``torch_dtype`` (older), else the
    dtype most of the weights are stored in, else float32."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is not None and value != "auto":
            return as_dtype(value, argument=f"{folder / 'config.json'}: {key}")
    return stored_dtype(folder, tensors) or torch.float32


def from_pretrained(name_or_path, device=None, dtype: Union[torch.dtype, str] = torch.float32, tokenizer=None,
                    device_map=None, n_devices: Optional[int] = None, revision: Optional[str] = None,
                    **kwargs) -> HookedTransformer:
    """Load a folder, a shipped model or a Hugging Face repo id at ``revision`` (a branch, tag or
    commit; default main; ``checkpoints.py`` names training checkpoints' revisions) (see the module
    docstring; ``dtype`` may be "auto"); weight processing (``fold_ln``, ``center_reader_weights``, ``center_writing_weights``,
    ``center_unembed``, ``fold_value_biases``, ``refactor_factored_attn_matrices``, all False by
    default) is opt-in and recorded on ``model.processing``.

    ``device_map`` (a dict of parts, a list of devices, "auto" or "balanced") or ``n_devices`` (the
    blocks split over cuda:0 .. cuda:n-1) place the model across devices (``glassbox.models.devices``):
    it is then loaded and processed on the CPU, and each part moved to its device."""
    steps = {step: bool(kwargs.pop(step)) for step in ALL_STEPS if step in kwargs}
    if kwargs:
        raise TypeError(f"unexpected options for from_pretrained: {', '.join(kwargs)}; weight processing "
                        f"options are {', '.join(ALL_STEPS)}")
    check_name(name_or_path)
    check_revision(name_or_path, revision)
    as_dtype(dtype)  # a bad dtype is refused before anything is fetched
    if device is not None:  # and a device this machine cannot use
        check_device(device, "from_pretrained(device=...)", allow_meta=False)
    placement = requested_map(device, device_map, n_devices)
    folder = resolve(name_or_path, revision=revision)
    try:
        model = load_folder(folder, device="cpu" if placement is not None else device, dtype=dtype,
                            tokenizer=tokenizer, model_name=_model_name(name_or_path))
    except FileNotFoundError as err:  # a snapshot without a file: name the revision it is the snapshot of
        if revision is None:
            raise
        raise FileNotFoundError(f"{err} (the snapshot of revision {revision!r} of {str(name_or_path)!r})") from err
    model = process(model, **steps) if any(steps.values()) else model
    return model.place(placement) if placement is not None else model


def _model_name(name_or_path) -> Optional[str]:
    """The name a model loaded by repo id gets (its folder is a snapshot named by a commit hash)."""
    path = Path(name_or_path).expanduser()
    name = str(name_or_path)
    if path.is_dir() or (SHIPPED_DIR / name).is_dir():
        return None
    return name


def config_of(name_or_path, revision: Optional[str] = None) -> Config:
    """The Config of a model ``from_pretrained`` can load, without reading (or downloading) its weights:
    a GPT-2 hub name's from its sizes, anything else's from its config.json (a repo id's fetched alone
    when it is not cached). Footgun: a config that ties the embeddings over a checkpoint whose lm_head
    differs loads untied (family.resolve_tying); that needs the weights, so this Config says tied."""
    check_name(name_or_path)
    if str(name_or_path) in HUB_MODELS and revision is None and not Path(str(name_or_path)).expanduser().is_dir():
        return hub_config(str(name_or_path)).replace(model_name=str(name_or_path))
    folder, name = resolve(name_or_path, files=["config.json"], revision=revision), _model_name(name_or_path)
    if tl_format.is_tl_format(read_config(folder)):
        return tl_format.config_from_tl(read_config(folder), _source(folder, name), name or folder.name)
    hf_config, model_type, arch = _folder_config(folder, name)
    return _config_from(arch, hf_config, folder, name)


def architecture_of(name_or_path: Union[str, Path], revision: Optional[str] = None):
    """The ``Architecture`` a name or folder loads as, read from its config.json alone (the entry of its
    model_type, as ``from_pretrained`` picks it): an OPT model's is OPT's though its Config is also GPT-2's.
    None for a model in TransformerLens's own format (``tl_format``), which has none."""
    if str(name_or_path) in HUB_MODELS and revision is None and not Path(str(name_or_path)).expanduser().is_dir():
        return ARCHITECTURES["gpt2"]
    folder = resolve(name_or_path, files=["config.json"], revision=revision)
    config = read_config(folder)
    if tl_format.is_tl_format(config):  # TransformerLens's own format: no Hugging Face architecture
        return None
    return _architecture(config, _source(folder, _model_name(name_or_path)))


def _source(folder: Path, model_name: Optional[str]) -> str:
    """How errors name a folder's config.json: with the repo id a hub snapshot was loaded by."""
    return str(folder / "config.json") + (f" (the snapshot of {model_name!r})" if model_name else "")


def _folder_config(folder: Path, model_name: Optional[str] = None) -> tuple:
    """(hf_config, model_type, architecture) of a folder, its config.json's fields checked."""
    import transformers

    config = read_config(folder)
    source = _source(folder, model_name)
    model_type = config.get("model_type")
    arch = _architecture(config, source)
    check_config_fields(config, arch.config_fields, source)
    check_rope_fields(config, source)
    if model_type != arch.model_type:  # picked by its model class: a config with no (or another) model_type
        config = {**config, "model_type": arch.model_type}
    try:
        hf_config = getattr(transformers, arch.hf_config_class).from_dict(config)
    except Exception as err:  # transformers validates some fields itself, with its own error types
        raise ValueError(f"{source}: transformers refused the config ({type(err).__name__}: {err})") from err
    return hf_config, model_type, arch


def _architecture(config: dict, source: str):
    """The converter for config.json's ``model_type``; else, when the config has no model_type or one
    ``transformers`` does not know, for the model class in its ``architectures``. A model_type that
    transformers knows as an architecture glassbox does not convert is refused (naming both) rather
    than read as the class its ``architectures`` claims."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type == "mistral" and "layer_types" in config:  # as transformers' AutoConfig reads it
        model_type = MISTRAL_WITH_LAYER_TYPES
    listed = config.get("architectures")
    names = [a for a in listed if isinstance(a, str)] if isinstance(listed, list) else []
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES and model_type not in ARCHITECTURES:
        named = f" (architectures={names})" if names else ""
        raise ValueError(f"{source} describes model_type={model_type!r}{named}; glassbox converts "
                         f"{', '.join(ARCHITECTURES)}")
    return architecture_of_type(model_type, source=source, hf_architectures=names or None)


def _config_from(arch, hf_config, folder: Path, model_name: Optional[str] = None) -> Config:
    try:
        return arch.config_from(hf_config).replace(model_name=model_name or folder.name)
    except ValueError as err:
        raise ValueError(f"{_source(folder, model_name)}: {err}") from err


def load_folder(folder: Path, device=None, dtype: Union[torch.dtype, str] = torch.float32,
                tokenizer=None, model_name: Optional[str] = None) -> HookedTransformer:
    """A Hugging Face folder of an architecture glassbox converts -> HookedTransformer (``model_name``
    defaults to the folder's name); errors name the file or tensor."""
    folder = Path(folder)
    source = _source(folder, model_name)
    as_dtype(dtype)
    if tl_format.is_tl_format(read_config(folder)):
        return _load_tl_folder(folder, device, dtype, tokenizer, model_name)
    hf_config, model_type, arch = _folder_config(folder, model_name)
    weights = weights_file(folder)
    # A PyTorch checkpoint has no header to read shapes from: it is read once, here.
    tensors = read_state_dict(folder) if weights.name == PYTORCH_BIN else None
    shapes = {k: tuple(v.shape) for k, v in tensors.items()} if tensors is not None else weight_shapes(folder)
    check_against_weights(hf_config, arch.weight_layout, shapes, source, str(weights))
    cfg = _config_from(arch, hf_config, folder, model_name)
    dtype = as_dtype(dtype) or auto_dtype(read_config(folder), folder, tensors)
    # transformers' rule for a tied config over an untied checkpoint (family.resolve_tying)
    cfg, tensors = resolve_tying(cfg, tensors if tensors is not None else read_state_dict(folder), arch.tied_names)
    state = arch.to_glassbox(tensors, cfg, source=str(weights))
    tokenizer_source = "the tokenizer= argument"
    # every tokenizer file present must be a regular file (a link to /dev/zero would be read forever)
    present = [is_regular(folder / f) for f in TOKENIZER_FILES + TOKENIZER_EXTRAS] if tokenizer is None else []
    if any(present[:len(TOKENIZER_FILES)]):
        tokenizer, tokenizer_source = load_tokenizer(folder), f"saved in {folder}"
    return build(cfg, state, tokenizer, device, dtype, tokenizer_source)


def _load_tl_folder(folder: Path, device, dtype, tokenizer, model_name: Optional[str]) -> HookedTransformer:
    """A folder in TransformerLens's own format (``tl_format.py``); its tokenizer from the repo or folder
    its config's tokenizer_name names."""
    config = read_config(folder)
    cfg, state, path = tl_format.read_tl_folder(folder, config, model_name)
    dtype = as_dtype(dtype) or auto_dtype({}, folder, state)
    tokenizer_source = "the tokenizer= argument"
    name = config.get("tokenizer_name")
    if tokenizer is None and name is not None:
        try:
            tokenizer_folder = resolve(name, files=[*TOKENIZER_FILES, *TOKENIZER_EXTRAS])
        except (ModelNotFoundError, ValueError) as err:
            raise ModelNotFoundError(f"the tokenizer {name!r} that {_source(folder, model_name)} names "
                                     f"(tokenizer_name) could not be found: {err}") from err
        tokenizer, tokenizer_source = load_tokenizer(tokenizer_folder), f"{name!r}, the config's tokenizer_name"
    return build(cfg, state, tokenizer, device, dtype, tokenizer_source)


def load_tokenizer(folder: Path):
    """The tokenizer saved in ``folder``; a damaged file is an error naming the folder and its files."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # tokenizers and transformers raise many types for damaged files
        files = ", ".join(sorted(p.name for p in Path(folder).iterdir() if p.name in TOKENIZER_FILES + TOKENIZER_EXTRAS))
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


def from_hf(hf_model, tokenizer=None, device=None, dtype: Union[torch.dtype, str, None] = None,
            device_map=None, n_devices: Optional[int] = None) -> HookedTransformer:
    """An in-memory ``transformers`` model of an architecture glassbox converts -> HookedTransformer with
    the same weights; ``dtype`` None or "auto" keeps the model's own. ``device_map`` / ``n_devices`` as
    for ``from_pretrained`` (built on the CPU, then placed)."""
    dtype = as_dtype(dtype)
    if device is not None:
        check_device(device, "from_hf(device=...)", allow_meta=False)
    placement = requested_map(device, device_map, n_devices)
    if placement is not None:
        return from_hf(hf_model, tokenizer, "cpu", dtype).place(placement)
    arch = architecture_of_type(getattr(hf_model.config, "model_type", None), source=type(hf_model).__name__,
                                hf_architectures=[type(hf_model).__name__])
    cfg, hf_state = resolve_tying(arch.config_from(hf_model.config), hf_model.state_dict(), arch.tied_names)
    state = arch.to_glassbox(hf_state, cfg)
    first = next(hf_model.parameters())
    return build(cfg, state, tokenizer, device or first.device, dtype or first.dtype)
