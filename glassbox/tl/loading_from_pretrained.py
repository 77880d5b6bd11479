"""TransformerLens's ``loading_from_pretrained``: the model names glassbox can load, their aliases, and
training checkpoints.

``OFFICIAL_MODEL_NAMES`` lists what ``HookedTransformer.from_pretrained`` loads by name: the GPT-2 hub
models, the Pythia and Stanford CRFM GPT-2 repos (by TransformerLens's short names too: "pythia-70m",
"stanford-gpt2-small-a"), the OPT, GPT-Neo, GPT-J and TinyStories repos ("opt-125m", "gpt-neo-125M",
"gpt-j", "tiny-stories-1M") and the models shipped inside glassbox. A local Hugging Face folder of an
architecture glassbox converts works too, by path, and so does a Hugging Face repo id: "org/name"
always (fetched when not cached), a bare name when it is in the local Hugging Face cache.
TransformerLens's own-format models load by its names too ("solu-1l" .. "solu-12l", "gelu-1l" ..
"gelu-4l", "attn-only-1l" .. "attn-only-4l", the Wiki finetunes: NeelNanda's repos, read by
``glassbox.weights.tl_format``); its old SoLU checkpoints ("solu-4l-old") and the shortformer demo
("attn-only-demo") are refused saying why; other short names (families glassbox does not convert) are
refused with the list of names that work.

Checkpoints (``checkpoint_index=`` / ``checkpoint_value=``, ``get_checkpoint_labels``) are the step
revisions of the Pythia and Stanford CRFM repos (``glassbox.weights.checkpoints``): the published
schedule, loaded from the local hub cache's revision (``refs/step1000``) or fetched; one the cache
lacks offline is an error naming the revision and the revisions cached.
"""

import dataclasses
from typing import Dict, List, Optional

from ..weights.checkpoints import checkpoint_labels, checkpoint_revision
from ..weights.pretrained import HUB_MODELS, is_hub_repo_id, shipped_models

PYTHIA_SIZES = ["14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b"]
PYTHIA_VARIANTS = {size: ["", "-deduped", "-deduped-v0", "-v0"] if size not in ("14m", "31m") else [""]
                   for size in PYTHIA_SIZES}
PYTHIA_VARIANTS["160m"] += ["-seed1", "-seed2", "-seed3"]
STANFORD = {"small": ["alias-gpt2-small-x21", "battlestar-gpt2-small-x49", "caprica-gpt2-small-x81",
                      "darkmatter-gpt2-small-x343", "expanse-gpt2-small-x777"],
            "medium": ["arwen-gpt2-medium-x21", "beren-gpt2-medium-x49", "celebrimbor-gpt2-medium-x81",
                       "durin-gpt2-medium-x343", "eowyn-gpt2-medium-x777"]}

# OPT, GPT-Neo, GPT-J and TinyStories (GPT-Neo) repos by TransformerLens's names.
OPT_SIZES = {"125m": "small", "1.3b": "medium", "2.7b": "large", "6.7b": "xl", "13b": "xxl", "30b": "xxxl",
             "66b": "xxxxl"}
NEO_SIZES = {"125M": "small", "1.3B": "medium", "2.7B": "large"}
TINY_STORIES = {**{size: size for size in ("1M", "3M", "8M", "28M", "33M")}, "1Layer-21M": "1L-21M",
                "2Layers-33M": "2L-33M", **{f"Instruct-{size}": f"instruct-{size}" for size in ("1M", "3M", "8M", "28M", "33M")},
                "Instruct-2Layers-33M": "instruct-2L-33M",
                "Instuct-1Layer-21M": "instruct-1L-21M"}  # (sic: the repo's own spelling)

# TransformerLens's aliases of the names glassbox loads.
MODEL_ALIASES: Dict[str, List[str]] = {
    "gpt2": ["gpt2-small"],
    "gpt2-medium": ["gpt2-medium"],
    "gpt2-large": ["gpt2-large"],
    "gpt2-xl": ["gpt2-xl"],
    "distilgpt2": ["distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"],
    **{f"EleutherAI/pythia-{size}{variant}": [f"pythia-{size}{variant}"] + (["pythia"] if size + variant == "70m"
                                                                          else [])
       for size, variants in PYTHIA_VARIANTS.items() for variant in variants},
    **{f"stanford-crfm/{repo}": [f"stanford-gpt2-{size}-{'abcde'[i]}"]
       for size, repos in STANFORD.items() for i, repo in enumerate(repos)},
    **{name: [] for name in shipped_models()},
    **{f"facebook/opt-{size}": [f"opt-{size}", f"opt-{alias}"] + (["opt"] if size == "125m" else [])
       for size, alias in OPT_SIZES.items()},
    **{f"EleutherAI/gpt-neo-{size}": [f"gpt-neo-{size}", f"gpt-neo-{alias}", f"neo-{alias}"]
       + (["neo"] if size == "125M" else []) for size, alias in NEO_SIZES.items()},
    "EleutherAI/gpt-j-6B": ["gpt-j-6B", "gpt-j", "gptj"],
    **{f"roneneldan/TinyStories-{repo}": [f"tiny-stories-{alias}"] for repo, alias in TINY_STORIES.items()},
    # TransformerLens's own-format models (glassbox.weights.tl_format), by TransformerLens's names
    **{f"NeelNanda/{kind}_{n}L512W_C4_Code": [f"{short}-{n}l", f"{short}-{n}l-new", f"{short}-{n}l-c4-code"]
       for kind, short in (("SoLU", "solu"), ("GELU", "gelu"), ("Attn_Only", "attn-only")) for n in (1, 2, 3, 4)},
    **{f"NeelNanda/SoLU_{n}L{w}W_C4_Code": [f"solu-{n}l", f"solu-{n}l-new", f"solu-{n}l-c4-code"]
       for n, w in ((6, 768), (8, 1024), (10, 1280), (12, 1536))},
    **{f"NeelNanda/SoLU_{n}L512W_Wiki_Finetune": [f"solu-{n}l-wiki", f"solu-{n}l-wiki-finetune", f"solu-{n}l-finetune"]
       for n in (1, 4)},
}
# TransformerLens's names of own-format models glassbox cannot compute: each refused saying why.
REFUSED_NAMES: Dict[str, str] = {
    **{name: "TransformerLens's old SoLU checkpoints (its 'neel-solu-old' layout) are not converted by glassbox"
       for n in (1, 2, 4, 6, 8, 10, 12) for name in (f"solu-{n}l-pile", f"solu-{n}l-old")},
    **{name: "it has shortformer positions (added to the queries and keys only), which glassbox does not compute"
       for name in ("attn-only-demo", "attn-only-2l-demo", "attn-only-2l-shortformer-6b-big-lr",
                    "attn-only-2l-induction-demo")},
}
OFFICIAL_MODEL_NAMES: List[str] = [*HUB_MODELS, *(name for name in MODEL_ALIASES if name not in HUB_MODELS)]


def get_official_model_name(model_name: str) -> str:
    """The official name of ``model_name`` (an alias or official name, any case); a folder path is
    returned as it is. Anything else is a ValueError listing the names glassbox can load."""
    from pathlib import Path

    if Path(str(model_name)).expanduser().is_dir():
        return str(model_name)
    lowered = str(model_name).lower()
    if lowered in REFUSED_NAMES:
        raise ValueError(f"{model_name!r} cannot be loaded by glassbox: {REFUSED_NAMES[lowered]}")
    for official, aliases in MODEL_ALIASES.items():
        if lowered == official.lower() or lowered in (a.lower() for a in aliases):
            return official
    if is_hub_repo_id(str(model_name)):
        return str(model_name)
    from ..suggest import did_you_mean

    spellings = [*MODEL_ALIASES, *(a for aliases in MODEL_ALIASES.values() for a in aliases)]
    raise ValueError(f"{model_name!r} is not a model glassbox can load by name"
                     f"{did_you_mean(str(model_name), spellings)}; the names are "
                     f"{', '.join(OFFICIAL_MODEL_NAMES)} (and their aliases), or pass a local Hugging Face folder "
                     "or a Hugging Face repo id ('org/name')")


def get_pretrained_model_config(model_name: str, hf_cfg=None, checkpoint_index=None, checkpoint_value=None,
                                fold_ln: bool = False, device=None, n_devices: int = 1,
                                default_prepend_bos=None, dtype=None, first_n_layers=None, n_ctx=None, **kwargs):
    """The HookedTransformerConfig ``HookedTransformer.from_pretrained(model_name, fold_ln=fold_ln)`` builds,
    read from the model's config alone (no weights are loaded); a checkpoint (``checkpoint_index`` or
    ``checkpoint_value``) or a ``revision=`` reads that revision's config. Several devices, a cut
    number of layers or context, and other options are refused by name.
    """
    import torch

    from ..weights.pretrained import config_of
    from .config import HookedTransformerConfig

    revision = kwargs.pop("revision", None)
    refused = dict(hf_cfg=hf_cfg, first_n_layers=first_n_layers, n_ctx=n_ctx, **kwargs)
    named = [name for name, value in refused.items() if value is not None]
    if named or n_devices != 1:
        raise ValueError(f"get_pretrained_model_config: {', '.join(named or ['n_devices'])} not supported by glassbox")
    name = get_official_model_name(model_name)
    revision, checkpoint = checkpoint_fields(name, checkpoint_index, checkpoint_value, revision)
    cfg = config_of(name, revision=revision)
    if isinstance(dtype, str) and dtype == "auto":  # what from_pretrained(dtype="auto") would load
        from ..weights.files import read_config
        from ..weights.pretrained import auto_dtype, resolve

        folder = resolve(name)
        dtype = auto_dtype(read_config(folder), folder)
    else:
        from ..weights.pretrained import as_dtype

        dtype = as_dtype(dtype)
    fields = dict(normalization_type=cfg.normalization + ("Pre" if fold_ln and cfg.norm_placement != "post" else ""),
                  dtype=dtype if dtype is not None else torch.float32, model_name=model_name,
                  layer_norm_folding=fold_ln)
    if device is not None:
        fields["device"] = str(device)
    if default_prepend_bos is not None:
        fields["default_prepend_bos"] = default_prepend_bos
    fields["tokenizer_name"] = tokenizer_name_of(name, revision)
    return HookedTransformerConfig.from_glassbox(cfg, **fields, **checkpoint)


GPT2_TOKENIZER_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2", "openai-community/gpt2")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def tokenizer_name_of(official: str, revision: Optional[str] = None) -> Optional[str]:
    """``cfg.tokenizer_name`` of a model loaded by name: where ``AutoTokenizer.from_pretrained`` finds its
    tokenizer, as TransformerLens sets it (code such as a subclass that builds only the tokenizer reloads
    it from there): GPT-2's names; a folder, or a hub repo id, whose files hold a tokenizer. None for a
    model without tokenizer files (a shipped model, whose tokenizer glassbox builds itself)."""
    from pathlib import Path

    from ..weights.pretrained import SHIPPED_DIR, resolve

    if official in GPT2_TOKENIZER_NAMES:
        return official
    own = tl_format_tokenizer(str(official))
    if own is not None:  # TransformerLens's own-format models name their tokenizer's repo
        return own
    folder = Path(str(official)).expanduser()
    if not folder.is_dir():
        if not is_hub_repo_id(str(official)) or (SHIPPED_DIR / str(official)).is_dir():
            return None
        folder = resolve(official, revision=revision)
    return str(official) if any((folder / name).is_file() for name in TOKENIZER_FILES) else None


def tl_format_tokenizer(official: str) -> Optional[str]:
    """The tokenizer_name of a model in TransformerLens's own format (glassbox.weights.tl_format), else None."""
    from ..weights.files import read_config
    from ..weights.pretrained import resolve
    from ..weights.tl_format import is_tl_format

    try:
        config = read_config(resolve(official, files=["config.json"]))
    except (OSError, ValueError):
        return None
    return config.get("tokenizer_name") if is_tl_format(config) else None


def get_checkpoint_labels(model_name: str, **kwargs):
    """(the steps a model's training checkpoints were saved at, in order; "step") for the Pythia and
    Stanford CRFM repos; a ValueError for any other model (TransformerLens's own-format checkpointed
    models are not loadable here). ``kwargs`` (TransformerLens passes them to the hub) are ignored."""
    return checkpoint_labels(get_official_model_name(model_name))


def checkpoint_fields(official: str, checkpoint_index: Optional[int] = None, checkpoint_value: Optional[int] = None,
                      revision: Optional[str] = None):
    """(the revision to load, the config's checkpoint fields) for ``from_pretrained``'s arguments; a
    checkpoint together with a ``revision`` is refused (both choose the revision)."""
    if checkpoint_index is None and checkpoint_value is None:
        return revision, dict(from_checkpoint=False)
    if revision is not None:
        raise ValueError(f"give either revision={revision!r} or a checkpoint (checkpoint_index={checkpoint_index!r}, "
                         f"checkpoint_value={checkpoint_value!r}), not both: each chooses the revision loaded")
    checkpoint_revision_name, step, _ = checkpoint_revision(official, checkpoint_index, checkpoint_value)
    index = checkpoint_index if checkpoint_index is not None else checkpoint_labels(official)[0].index(step)
    return checkpoint_revision_name, dict(from_checkpoint=True, checkpoint_index=index, checkpoint_value=step,
                                          checkpoint_label_type="step")


# The weight matrices whose absence means a wrong conversion: filling them would silently zero a sublayer.
FAIL_LOUD_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "_W_K", "_W_V", "W_in", "W_gate", "W_out")


def fill_missing_keys(model, state_dict: dict) -> dict:
    """TransformerLens 3.9's ``fill_missing_keys``: ``state_dict`` (changed in place and returned) with every
    key of ``model.state_dict()`` it lacks filled with the model's current tensor (keys holding "hf_model"
    skipped). A missing attention or MLP matrix (``FAIL_LOUD_WEIGHTS``) is a ValueError naming them, before
    anything is filled; another missing weight matrix, or a norm's w / b (filled with the model's, the
    identity norm of a fresh model), is filled with a ``logging.warning`` naming it, in TransformerLens's words."""
    import logging
    from collections.abc import MutableMapping

    if not isinstance(state_dict, MutableMapping):
        raise TypeError(f"state_dict must be a dict of parameter name to tensor, got {type(state_dict).__name__}")
    if not callable(getattr(model, "state_dict", None)):
        raise TypeError(f"model must be a torch module (it gives the keys and defaults), got {type(model).__name__}")
    default = model.state_dict()
    missing = sorted(set(default) - set(state_dict))
    loud = [key for key in missing if "hf_model" not in key and key.rsplit(".", 1)[-1] in FAIL_LOUD_WEIGHTS]
    if loud:
        raise ValueError(f"Pretrained state dict is missing weight matrices the model expects: {loud}. This usually "
                         "means the weight converter and the instantiated module disagree on parameter naming. "
                         "Refusing to zero-fill them, which would silently produce wrong outputs.")
    for key in missing:
        if "hf_model" in key:
            continue
        leaf = key.rsplit(".", 1)[-1]
        if "W_" in key:
            logging.warning(f"Missing key for a weight matrix in pretrained, filled in with an empty tensor: {key}")
        elif leaf in ("w", "b") and ("ln" in key or "norm" in key):
            logging.warning(f"Missing normalization key in pretrained, filled with its default (identity norm): {key}")
        state_dict[key] = default[key]
    return state_dict


@dataclasses.dataclass
class Config:
    """TransformerLens's basic config: the sizes of a model (``get_basic_config``)."""

    d_model: int = 768
    debug: bool = True
    layer_norm_eps: float = 1e-5
    d_vocab: int = 50257
    init_range: float = 0.02
    n_ctx: int = 1024
    d_head: int = 64
    d_mlp: int = 3072
    n_heads: int = 12
    n_layers: int = 12


def get_basic_config(model_name: str, **kwargs) -> Config:
    """``Config`` of the fields of ``get_pretrained_model_config(model_name, **kwargs)`` it has."""
    values = get_pretrained_model_config(model_name, **kwargs).to_dict()
    return Config(**{field.name: values[field.name] for field in dataclasses.fields(Config) if field.name in values})
