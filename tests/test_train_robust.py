"""The trainer's library API on hostile inputs: chunked tokenization equal to whole-text
tokenization, non-finite hyperparameters, interrupted checkpoint saves, damaged checkpoints.
(The command line's refusals are in ``test_train_cli_errors.py``.)"""

import math
import os
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassbox.models import Config
from glassbox.train import (CheckpointError, TrainConfig, Trainer, encode_text, init_model, load_checkpoint,
                            lr_at, make_optimizer, recover_checkpoint, save_checkpoint, train_bpe_tokenizer)
from glassbox.fs import JOURNAL, RECORD
from glassbox.train.checkpoint import CONFIG_FILE, MODEL_FILE, STATE_FILE
from glassbox.train.tokenizer import text_chunks

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_bpe_tokenizer(AUSTEN.read_text(encoding="utf-8")[:50_000], 300,
                               tmp_path_factory.mktemp("tok"))


def whole(tokenizer, text):  # the oracle: the tokenizer on the whole text at once
    return tokenizer.encode(text, add_special_tokens=False, verbose=False)


def chunked(tokenizer, text, size):
    chunks = list(text_chunks(text, size))
    assert "".join(chunks) == text
    return [i for c in chunks for i in tokenizer.encode(c, add_special_tokens=False)], len(chunks)


def test_blank_lines_at_chunk_ends_tokenize_like_the_whole_text(tokenizer):
    # Every paragraph ends in a blank line, so the last line break within a chunk is often in one.
    text = "".join(f"Para {i} was short.\n\n{'  ' * (i % 3)}Then a line.\nAnd another\n\n\n" for i in range(200))
    for size in (23, 40, 61, 97):
        ids, n = chunked(tokenizer, text, size)
        assert n > 20 and ids == whole(tokenizer, text), size


def test_random_whitespace_texts_tokenize_like_the_whole_text(tokenizer):
    rng = random.Random(0)
    alphabet = ["a", "b", "é", " ", "\n", "\n\n", "\t", "\u00a0", ".", "7", "'s", "\r\n"]
    for trial in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120)))
        size = rng.randint(1, 30)
        assert chunked(tokenizer, text, size)[0] == whole(tokenizer, text), (trial, text, size)


def test_text_without_a_lone_line_break_is_one_chunk(tokenizer):
    text = "one long line " * 50 + "\n\n\n" + "x" * 100
    assert list(text_chunks(text, 16)) == [text]


def test_encode_text_equals_whole_text_on_austen(tokenizer):
    text = AUSTEN.read_text(encoding="utf-8")[:300_000]
    assert encode_text(text, tokenizer).tolist() == whole(tokenizer, text)


# -- non-finite hyperparameters ------------------------------------------------------------------

CFG = Config(d_model=15, n_layers=1, n_heads=3, d_vocab=29, n_ctx=11, d_mlp=22)
STREAM = torch.randint(0, 28, (300,), generator=torch.Generator().manual_seed(0))
TC = TrainConfig(steps=4, batch_size=3, warmup_steps=1, eval_every=2, eval_batches=1, seed=3)


@pytest.mark.parametrize("name", ["lr", "grad_clip", "weight_decay", "min_lr_frac", "repeat_frac"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_train_config_refuses_non_finite_values(name, value):
    with pytest.raises(ValueError, match=f"TrainConfig.{name} .*{value!r}"):
        TrainConfig(**{**TC.__dict__, name: value})


@pytest.mark.parametrize("lr,wd", [(math.nan, 0.1), (math.inf, 0.1), (1e-3, math.nan), (1e-3, math.inf)])
def test_optimizer_and_schedule_refuse_non_finite_values(lr, wd):
    model = init_model(CFG, 0)
    with pytest.raises(ValueError, match="lr|weight_decay"):
        make_optimizer(model, lr, wd)
    if not math.isfinite(lr):
        with pytest.raises(ValueError, match="lr"):
            lr_at(0, lr, 1, 4)


def test_repeat_span_that_cannot_fit_is_refused_before_training():
    config = TrainConfig(**{**TC.__dict__, "repeat_frac": 0.5, "min_repeat": 6})
    with pytest.raises(ValueError, match="min_repeat=6 .*n_ctx=11"):
        Trainer(init_model(CFG, 0), STREAM, STREAM, 28, config, progress=False)


# -- a save killed at any instant ----------------------------------------------------------------

class Killed(BaseException):
    """Stands for the process dying: nothing in the save catches a BaseException or cleans up."""


@pytest.fixture
def sweep_dir(tmp_path):
    from fs_faults import fast_tmp

    path = fast_tmp(tmp_path)  # tmpfs: each fsync costs microseconds
    yield path
    if path != tmp_path:
        shutil.rmtree(path, ignore_errors=True)


def run_killed_at(event: int, after: bool, action) -> bool:
    """Run ``action`` with every file-system call counted (tests/fs_faults.py); die before (or after) call
    ``event``. Returns True if it died (False: the action made fewer calls). A real kill of the process
    at every call is tested once, for glassbox.fs itself (tests/test_fs_folder.py)."""
    from fs_faults import raise_at

    return raise_at(event, action, Killed, after)


def ckpt_state(step: int) -> dict:
    return {"step": step, "optimizer": {}, "data_rng": torch.Generator().manual_seed(step).get_state(),
            "history": {"train": [[step, 1.0]], "eval": []}, "train_config": TC.__dict__}


def assert_complete_checkpoint(folder: Path, models: dict) -> int:
    """The checkpoint loads, is one of ``models`` (step -> model) whole, and no leftovers remain."""
    cfg, weights, state = load_checkpoint(folder)
    step = state["step"]
    assert step in models and cfg == CFG
    expected = models[step].state_dict()
    assert all(torch.equal(weights[k], expected[k].contiguous()) for k in expected), f"step {step}: mixed files"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == sorted([RECORD, MODEL_FILE, CONFIG_FILE, STATE_FILE])
    return step


@pytest.mark.parametrize("after", [False, True])
def test_a_save_killed_at_any_call_leaves_the_old_or_the_new_checkpoint(sweep_dir, after):
    tmp_path = sweep_dir
    models = {3: init_model(CFG, 3), 6: init_model(CFG, 6)}
    seen, event = set(), 1
    while True:
        root = tmp_path / f"{event}"
        folder = root / "checkpoint"
        save_checkpoint(folder, models[3], ckpt_state(3))
        if not run_killed_at(event, after, lambda: save_checkpoint(folder, models[6], ckpt_state(6))):
            break
        leftovers = sorted(p.name for p in root.iterdir()) + sorted(
            p.name for p in folder.iterdir() if p.name.startswith(".glassbox-") and p.name != RECORD)
        # Recovery may itself be killed at any of its calls; a later recovery still succeeds.
        for inner in range(1, 8):
            copy = tmp_path / f"{event}-{inner}"
            shutil.copytree(root, copy)
            run_killed_at(inner, after, lambda: recover_checkpoint(copy / "checkpoint"))
            assert_complete_checkpoint(copy / "checkpoint", models)
        seen.add((assert_complete_checkpoint(folder, models), tuple(leftovers)))
        save_checkpoint(folder, models[6], ckpt_state(6))  # and the next save works
        assert assert_complete_checkpoint(folder, models) == 6
        event += 1
    assert event > 10, "the save made fewer file-system calls than expected: is the harness counting?"
    assert {step for step, _ in seen} == {3, 6}
    # The instants after the commit point were among those tried: the journal left, the new checkpoint wins.
    assert any(step == 6 and JOURNAL in leftovers for step, leftovers in seen), sorted(seen)


def test_leftovers_of_the_earlier_two_rename_save_are_recovered(tmp_path):
    # The earlier save renamed checkpoint -> checkpoint.old, then checkpoint.tmp -> checkpoint; killed
    # in between it left no checkpoint/ (the reported bug). The old checkpoint is complete; use it.
    model = init_model(CFG, 3)
    save_checkpoint(tmp_path / "checkpoint", model, ckpt_state(3))
    os.rename(tmp_path / "checkpoint", tmp_path / "checkpoint.old")
    (tmp_path / "checkpoint.tmp").mkdir()
    (tmp_path / "checkpoint.tmp" / MODEL_FILE).write_bytes(b"half")
    assert assert_complete_checkpoint(tmp_path / "checkpoint", {3: model}) == 3


# -- damaged and code-carrying checkpoints -------------------------------------------------------

class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / f"glassbox-pickle-ran-{os.getpid()}"


def damage(folder: Path, how: str) -> str:
    """Damage one file of a checkpoint; returns that file's name."""
    if how == "truncated weights":
        data = (folder / MODEL_FILE).read_bytes()
        (folder / MODEL_FILE).write_bytes(data[:len(data) // 2])
        return MODEL_FILE
    if how == "garbage state":
        (folder / STATE_FILE).write_bytes(b"\x80\x02garbage" * 10)
        return STATE_FILE
    if how == "truncated state":
        data = (folder / STATE_FILE).read_bytes()
        (folder / STATE_FILE).write_bytes(data[:len(data) // 3])
        return STATE_FILE
    if how == "code in state":
        torch.save({**ckpt_state(3), "history": RunsCode()}, folder / STATE_FILE)
        return STATE_FILE
    if how == "plain pickle of code":
        (folder / STATE_FILE).write_bytes(pickle.dumps(RunsCode()))
        return STATE_FILE
    if how == "state not a dict":
        torch.save([1, 2, 3], folder / STATE_FILE)
        return STATE_FILE
    if how == "garbage config":
        (folder / CONFIG_FILE).write_text("{not json")
        return CONFIG_FILE
    if how == "foreign config":
        (folder / CONFIG_FILE).write_text('{"d_model": 15, "hidden": 3}')
        return CONFIG_FILE
    raise AssertionError(how)


DAMAGES = ["truncated weights", "garbage state", "truncated state", "code in state", "plain pickle of code",
           "state not a dict", "garbage config", "foreign config"]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_checkpoint_is_refused_naming_the_file_and_runs_no_code(tmp_path, how):
    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, init_model(CFG, 3), ckpt_state(3))
    name = damage(folder, how)
    MARKER.unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match=str(folder / name).replace("\\", "\\\\")):
        Trainer.resume(folder, STREAM, STREAM, 28, progress=False)
    assert not MARKER.exists(), "loading the checkpoint ran code"


def test_checkpoint_of_another_shape_is_refused(tmp_path):
    folder = tmp_path / "checkpoint"
    save_checkpoint(folder, init_model(CFG, 3), ckpt_state(3))
    (folder / CONFIG_FILE).write_text((folder / CONFIG_FILE).read_text().replace('"d_mlp": 22', '"d_mlp": 23'))
    with pytest.raises(CheckpointError, match="does not fit together"):
        Trainer.resume(folder, STREAM, STREAM, 28, progress=False)
