"""Weights: pure converters (GPT-2, Llama, GPT-J), loading by name or folder (checked before anything is
built), export to Hugging Face (independent tensors; folders replaced in one swap), and weight
processing (fold_ln and friends)."""

from .architectures import ARCHITECTURES
from .files import read_state_dict
from .gpt2 import config_from_hf, config_to_hf, glassbox_to_hf, hf_to_glassbox
from .processing import process
from .pretrained import (HUB_MODELS, from_hf, from_pretrained, hub_config, load_folder, resolve,
                         save_pretrained, to_hf)

__all__ = ["ARCHITECTURES", "HUB_MODELS", "config_from_hf", "config_to_hf", "from_hf", "from_pretrained", "glassbox_to_hf",
           "hf_to_glassbox", "hub_config", "load_folder", "process", "read_state_dict", "resolve", "save_pretrained",
           "to_hf"]
