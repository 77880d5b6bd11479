"""The Hugging Face architectures glassbox converts to and from, keyed by ``model_type``.

Each entry names the ``transformers`` config and model classes and the four pure functions of its
converter module (``gpt2.py``, ``llama.py``, ``gptj.py``). Loading picks the entry by the folder's
or model's ``model_type``; exporting picks the first entry whose ``config_to`` accepts the glassbox
Config (each refuses configs it cannot represent, with the reason).
"""

from dataclasses import dataclass
from typing import Callable

from ..models import Config
from . import gpt2, gptj, llama


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hf_config_class: str  # a name in the transformers package
    hf_model_class: str
    config_from: Callable  # HF config -> Config
    to_glassbox: Callable  # (HF state dict, Config, source) -> our state dict
    config_to: Callable  # Config -> HF config (ValueError when it cannot represent it)
    to_hf: Callable  # (our state dict, Config) -> HF state dict


ARCHITECTURES = {
    "gpt2": Architecture("gpt2", "GPT2Config", "GPT2LMHeadModel", gpt2.config_from_hf, gpt2.hf_to_glassbox,
                         gpt2.config_to_hf, gpt2.glassbox_to_hf),
    "llama": Architecture("llama", "LlamaConfig", "LlamaForCausalLM", llama.config_from_llama,
                          llama.llama_to_glassbox, llama.config_to_llama, llama.glassbox_to_llama),
    "gptj": Architecture("gptj", "GPTJConfig", "GPTJForCausalLM", gptj.config_from_gptj, gptj.gptj_to_glassbox,
                         gptj.config_to_gptj, gptj.glassbox_to_gptj),
}


def architecture_of_type(model_type, source: str = "config") -> Architecture:
    """The entry for a Hugging Face ``model_type``; ValueError naming the supported ones."""
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ValueError(f"{source} describes model_type={model_type!r}; glassbox converts "
                         f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def architecture_of_config(cfg: Config) -> Architecture:
    """The first architecture that can represent ``cfg``; ValueError with each one's reason otherwise."""
    if cfg.attn_only:
        raise ValueError("no Hugging Face architecture has attention-only blocks (Config.attn_only=True), so this "
                         "model cannot be exported to transformers or saved as a Hugging Face folder")
    reasons = []
    for arch in ARCHITECTURES.values():
        try:
            arch.config_to(cfg)
            return arch
        except ValueError as err:
            reasons.append(f"{arch.model_type}: {err}")
    raise ValueError("no Hugging Face architecture can represent this config (a post-norm or sinusoidal model "
                     "has none; save it with glassbox's own checkpoint instead):\n  " + "\n  ".join(reasons))
