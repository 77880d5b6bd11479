"""Shared set-up for the TransformerLens-oracle tests: deterministic torch, helpers importable."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Tiny matrices: one thread is faster than two contending for the same small products.
torch.set_num_threads(1)
