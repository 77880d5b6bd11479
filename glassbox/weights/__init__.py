"""Weights: pure GPT-2 converters, loading by name or folder, and export to Hugging Face."""

from .files import read_state_dict
from .gpt2 import config_from_hf, config_to_hf, glassbox_to_hf, hf_to_glassbox
from .pretrained import (HUB_MODELS, from_hf, from_pretrained, hub_config, load_folder, resolve,
                         save_pretrained, to_hf)

__all__ = ["HUB_MODELS", "config_from_hf", "config_to_hf", "from_hf", "from_pretrained", "glassbox_to_hf",
           "hf_to_glassbox", "hub_config", "load_folder", "read_state_dict", "resolve", "save_pretrained",
           "to_hf"]
