"""Training small GPT-2s from scratch: tokenizer, data windows, optimizer, loop and checkpoints.

This layer sits above ``models`` and ``weights``; a trained model is exported with
``glassbox.weights.save_pretrained`` as a normal Hugging Face GPT-2 folder. ``rundir`` manages the
output folder of ``glassbox train`` (what a run writes, its recorded settings, the log on resume).
Bad values (NaN or infinite hyperparameters among them) raise ValueError naming the value; a
damaged checkpoint raises CheckpointError naming the file.
"""

from .checkpoint import CheckpointError, load_checkpoint, recover_checkpoint, save_checkpoint
from .data import (RepeatSpec, add_repeats, encode_text, heldout_batches, sample_windows, split_text,
                   training_batch, unigram_loss)
from .loop import TrainConfig, Trainer, init_model
from .optim import lr_at, make_optimizer, param_groups
from .tokenizer import load_tokenizer, train_bpe_tokenizer

__all__ = ["CheckpointError", "RepeatSpec", "TrainConfig", "Trainer", "add_repeats", "encode_text",
           "heldout_batches", "init_model", "load_checkpoint", "load_tokenizer", "lr_at", "make_optimizer",
           "param_groups", "recover_checkpoint", "sample_windows", "save_checkpoint", "split_text",
           "train_bpe_tokenizer", "training_batch", "unigram_loss"]
