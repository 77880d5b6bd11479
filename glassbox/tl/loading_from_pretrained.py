"""TransformerLens's ``loading_from_pretrained``: the model names glassbox can load, and their aliases.

``OFFICIAL_MODEL_NAMES`` lists what ``HookedTransformer.from_pretrained`` loads by name: the GPT-2 hub
models and the models shipped inside glassbox (a local Hugging Face folder of a GPT-2, Llama or GPT-J
works too, by path). TransformerLens's 200 other named models are out of scope: their names are
refused with the list of those that work.
"""

from typing import Dict, List

from ..weights.pretrained import HUB_MODELS, shipped_models

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
    raise ValueError(f"{model_name!r} is not a model glassbox can load by name; the names are "
                     f"{', '.join(OFFICIAL_MODEL_NAMES)} (and their aliases), or pass a local Hugging Face folder")
