"""The Hugging Face architectures glassbox converts to and from, keyed by ``model_type``.

Each family module lists its ``Architecture`` entries (``family.py``) in ``FAMILIES``. Loading picks
the entry by the folder's or model's ``model_type`` (or, for a model_type glassbox does not know, by
the model class named in config.json's ``architectures``); exporting picks the first entry whose
``config_to`` accepts the glassbox Config (each refuses configs it cannot represent, with the reason).
"""

from ..models import Config
from . import gemma, gpt2, gpt_neo, gptj, llama, neox, olmo2, opt, qwen
from .family import Architecture

ARCHITECTURES = {arch.model_type: arch for module in (gpt2, llama, gptj, qwen, gemma, neox, olmo2, opt, gpt_neo)
                 for arch in module.FAMILIES}

__all__ = ["ARCHITECTURES", "Architecture", "architecture_of_config", "architecture_of_type"]


def architecture_of_type(model_type, source: str = "config", hf_architectures=None) -> Architecture:
    """The entry for a Hugging Face ``model_type`` (else for a class in ``hf_architectures``);
    ValueError naming the architecture and the supported ones."""
    if isinstance(model_type, str) and model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    for name in hf_architectures or ():
        for arch in ARCHITECTURES.values():
            if arch.hf_model_class == name:
                return arch
    named = f" (architectures={list(hf_architectures)})" if hf_architectures else ""
    from ..suggest import did_you_mean

    raise ValueError(f"{source} describes model_type={model_type!r}{named}; glassbox converts "
                     f"{', '.join(ARCHITECTURES)}{did_you_mean(model_type, ARCHITECTURES)}")


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
