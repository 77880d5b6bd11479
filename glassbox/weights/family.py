"""``Architecture``: one Hugging Face architecture glassbox converts to and from.

Each family module (``gpt2.py``, ``llama.py``, ...) lists its entries in ``FAMILIES``;
``architectures.py`` collects them. An entry names the ``transformers`` config and model classes,
the four pure converter functions, and what ``checks.py`` verifies in a folder before building:
``config_fields`` (config.json field -> kind) and ``weight_layout`` (the layer-count field, a pattern
whose group is a layer index, and [(embedding tensor names, (config field of each axis))]).
"""

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hf_config_class: str  # a name in the transformers package
    hf_model_class: str
    config_from: Callable  # HF config -> Config
    to_glassbox: Callable  # (HF state dict, Config, source) -> our state dict
    config_to: Callable  # Config -> HF config (ValueError when it cannot represent it)
    to_hf: Callable  # (our state dict, Config) -> HF state dict
    config_fields: dict = field(default_factory=dict)
    weight_layout: Optional[tuple] = None
