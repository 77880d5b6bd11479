"""Shared set-up for the TransformerLens-oracle tests: deterministic torch, helpers importable."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(min(2, torch.get_num_threads()))
