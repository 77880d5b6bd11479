"""TransformerLens's ``loading_from_pretrained``: the model names glassbox can load, and their aliases.

``OFFICIAL_MODEL_NAMES`` lists what ``HookedTransformer.from_pretrained`` loads by name: the GPT-2 hub
models and the models shipped inside glassbox. A local Hugging Face folder of an architecture glassbox
converts works too, by path, and so does a Hugging Face repo id: "org/name" always (fetched when not
cached), a bare name when it is in the local Hugging Face cache. TransformerLens's other short names
("pythia-70m") are not aliases here: they are refused with the list of names that work.
"""

from typing import Dict, List

from ..weights.pretrained import HUB_MODELS, is_hub_repo_id, shipped_models

OFFICIAL_MODEL_NAMES: List[str] = list(HUB_MODELS) + shipped_models()

# TransformerLens's aliases of the names above.
MODEL_ALIASES: Dict[str, List[str]] = {
    "gpt2": ["gpt2-small"],
    "gpt2-medium": ["gpt2-medium"],
    "gpt2-large": ["gpt2-large"],
    "gpt2-xl": ["gpt2-xl"],
    "distilgpt2": ["distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"],
    **{name: [] for name in shipped_models()},
}


def get_official_model_name(model_name: str) -> str:
    """The official name of ``model_name`` (an alias or official name, any case); a folder path is
    returned as it is. Anything else is a ValueError listing the names glassbox can load."""
    from pathlib import Path

    if Path(str(model_name)).expanduser().is_dir():
        return str(model_name)
    lowered = str(model_name).lower()
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
    read from the model's config alone (no weights are loaded). Checkpoints, several devices, a cut
    number of layers or context, and other options are refused by name."""
    import torch

    from ..weights.pretrained import config_of
    from .config import HookedTransformerConfig

    refused = dict(hf_cfg=hf_cfg, checkpoint_index=checkpoint_index, checkpoint_value=checkpoint_value,
                   first_n_layers=first_n_layers, n_ctx=n_ctx, **kwargs)
    named = [name for name, value in refused.items() if value is not None]
    if named or n_devices != 1:
        raise ValueError(f"get_pretrained_model_config: {', '.join(named or ['n_devices'])} not supported by glassbox")
    name = get_official_model_name(model_name)
    cfg = config_of(name)
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
    return HookedTransformerConfig.from_glassbox(cfg, **fields)
