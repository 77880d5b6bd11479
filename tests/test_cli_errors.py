"""Mistakes on the command line of demo, parity and attention: each is one line on stderr,
``glassbox <command>: error: ...``, naming the value and what would be accepted, exit code 2, no
traceback. And ``glassbox demo`` on a folder written by ``glassbox train``, whose small tokenizer
cannot express the default answer and distractor as single tokens, chooses words it can.

Every case runs ``python -m glassbox`` in a subprocess, as a user would.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassbox.cli import main

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
TRAIN_ARGS = ["--layers", "2", "--d-model", "15", "--heads", "3", "--n-ctx", "19", "--vocab-size", "307",
              "--steps", "3", "--batch-size", "3", "--eval-every", "3", "--checkpoint-every", "3", "--seed", "5",
              "--no-progress"]
LONG_PROMPT = "word " * 300  # 300 tokens and more for every model here; the shipped model reads 128


def glassbox(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glassbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})


def assert_user_error(run: subprocess.CompletedProcess, command: str, *fragments: str) -> str:
    """One line on stderr, ``glassbox COMMAND: error: ...`` holding every fragment; exit 2."""
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith(f"glassbox {command}: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert run.returncode == 2, (run.returncode, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A folder written by ``glassbox train``: a 307-token BPE vocabulary, n_ctx 19."""
    root = tmp_path_factory.mktemp("trained")
    text = root / "text.txt"
    text.write_text(AUSTEN.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    out = root / "model"
    assert main(["train", "--text", str(text), "--out", str(out), *TRAIN_ARGS]) == 0
    return out


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A file, an empty folder, a missing path and a folder with a model but no tokenizer."""
    from glassbox.models import Config, HookedTransformer

    root = tmp_path_factory.mktemp("places")
    (root / "file.txt").write_text("not a model\n")
    (root / "empty").mkdir()
    torch.manual_seed(0)
    HookedTransformer(Config(d_model=15, n_layers=1, n_heads=3, d_vocab=29, n_ctx=17)).save_pretrained(root / "no-tok")
    return root


# --- --model ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["demo", "parity", "attention"])
def test_unknown_model_name_says_what_is_accepted(command, tmp_path):
    extra = ["--prompt", "x"] if command == "attention" else []
    out = ["--out", tmp_path / "o"] if command != "parity" else []
    line = assert_user_error(glassbox(command, "--model", "nosuch", *extra, *out), command,
                             "--model 'nosuch' is not a known model", "glassbox-austen", "gpt2", "folder")
    assert ("'random'" in line) == (command != "demo"), line  # demo has no random model


@pytest.mark.parametrize("command", ["demo", "parity", "attention"])
def test_missing_folder(command, places, tmp_path):
    extra = ["--prompt", "x"] if command == "attention" else []
    out = ["--out", tmp_path / "o"] if command != "parity" else []
    assert_user_error(glassbox(command, "--model", places / "missing", *extra, *out), command,
                      f"--model '{places / 'missing'}': no such folder", "a shipped model (glassbox-austen)")


def test_a_file_and_an_empty_folder_are_no_models(places, tmp_path):
    assert_user_error(glassbox("demo", "--model", places / "file.txt", "--out", tmp_path / "o"), "demo",
                      "is a file, not a model folder")
    assert_user_error(glassbox("demo", "--model", places / "empty", "--out", tmp_path / "o"), "demo",
                      "no config.json in", "a model folder holds config.json and model.safetensors")


def test_empty_model_and_out(tmp_path):
    assert_user_error(glassbox("parity", "--model", ""), "parity", "--model is empty", "glassbox-austen", "'random'")
    assert_user_error(glassbox("demo", "--out", ""), "demo", "--out is empty", "give a folder")
    assert_user_error(glassbox("attention", "--prompt", "x", "--out", ""), "attention", "--out is empty",
                      "give a file name")


def test_text_that_is_not_utf8(tmp_path):
    not_utf8 = os.fsdecode(b"ok \xff")  # what Python makes of argv bytes that are not UTF-8
    assert_user_error(glassbox("attention", "--prompt", not_utf8), "attention",
                      "argument --prompt: ", "holds bytes that are not UTF-8", "give UTF-8 text")
    assert_user_error(glassbox("demo", "--answer", not_utf8), "demo", "argument --answer: ", "not UTF-8")


@pytest.mark.parametrize("command", ["demo", "attention"])
def test_model_without_tokenizer(command, places, tmp_path):
    extra = ["--prompt", "x"] if command == "attention" else []
    assert_user_error(glassbox(command, "--model", places / "no-tok", *extra, "--out", tmp_path / "o"), command,
                      "has no tokenizer", "d_vocab=29")


def test_parity_without_tokenizer_still_compares_on_random_ids(places):
    run = glassbox("parity", "--model", places / "no-tok")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "random token ids" in run.stdout and "PARITY HOLDS" in run.stdout


@pytest.mark.parametrize("command", ["demo", "parity", "attention"])
def test_hub_name_unreachable_and_not_cached(command, tmp_path):
    extra = ["--prompt", "x"] if command == "attention" else []
    out = ["--out", tmp_path / "o"] if command != "parity" else []
    # A closed local port stands in for a hub that cannot be reached; an empty HF_HOME for an empty cache.
    unreachable = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    assert_user_error(glassbox(command, "--model", "gpt2", *extra, *out, env=unreachable), command,
                      "--model 'gpt2': the Hugging Face hub is unreachable and gpt2 is not in the local Hugging Face "
                      f"cache ({tmp_path / 'hf' / 'hub'})", "with network access", "glassbox-austen")
    if command == "demo":
        offline = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
        assert_user_error(glassbox(command, "--model", "gpt2", *extra, *out, env=offline), command,
                          "HF_HUB_OFFLINE is set and gpt2 is not in the local Hugging Face cache")


# --- --device, --seed, --max-tokens, --dtype (checked by argparse before anything loads) -------------

@pytest.mark.parametrize("command", ["demo", "parity", "attention"])
def test_bad_device(command):
    extra = ["--prompt", "x"] if command == "attention" else []
    assert_user_error(glassbox(command, "--device", "nonsense", *extra), command,
                      "argument --device: unknown device 'nonsense'", "cpu, cuda")
    if command == "demo" and not torch.cuda.is_available():
        assert_user_error(glassbox(command, "--device", "cuda", *extra), command,
                          "device 'cuda': this torch build has no usable CUDA device; use cpu")


def test_bad_seed():
    assert_user_error(glassbox("parity", "--model", "random", "--seed", "abc"), "parity",
                      "argument --seed: invalid seed 'abc'", "integer")
    assert_user_error(glassbox("attention", "--model", "random", "--seed", str(10 ** 30), "--prompt", "x"),
                      "attention", f"seed {10 ** 30} is out of range", "2**64 - 1")


def test_attention_max_tokens_must_be_a_count_and_is_enforced(tmp_path):
    assert_user_error(glassbox("attention", "--prompt", "x", "--max-tokens", "0"), "attention",
                      "argument --max-tokens: 0 is not a count", ">= 1")
    assert_user_error(glassbox("attention", "--model", "random", "--prompt", "a b c d e f", "--max-tokens", "4",
                               "--out", tmp_path / "v.html"), "attention",
                      "--prompt is 7 tokens, more than --max-tokens=4", "raise --max-tokens")
    assert not (tmp_path / "v.html").exists()


# --- --prompt ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["demo", "parity", "attention"])
def test_empty_prompt(command, tmp_path):
    out = ["--out", tmp_path / "o"] if command != "parity" else []
    assert_user_error(glassbox(command, "--prompt", "", *out), command, "--prompt is empty")


@pytest.mark.parametrize("command", ["demo", "attention"])
def test_prompt_longer_than_the_context(command, tmp_path):
    assert_user_error(glassbox(command, "--prompt", LONG_PROMPT, "--out", tmp_path / "o"), command,
                      "--prompt is 302 tokens (BOS included), more than the 128 this model reads (n_ctx)")


def test_attention_empty_prompt_without_bos(tmp_path):
    assert_user_error(glassbox("attention", "--prompt", "", "--no-bos", "--out", tmp_path / "v.html"), "attention",
                      "--prompt is empty")


def test_parity_prompt_longer_than_a_small_context(trained):
    assert_user_error(glassbox("parity", "--model", trained, "--prompt", "It is a truth universally acknowledged"),
                      "parity", "more than the 19 this model reads (n_ctx)")


# --- --out ----------------------------------------------------------------------------------------------

def test_demo_out_must_be_a_folder(places):
    assert_user_error(glassbox("demo", "--out", places / "file.txt"), "demo",
                      f"--out '{places / 'file.txt'}' is an existing file", "give a folder")
    assert_user_error(glassbox("demo", "--out", places / "file.txt" / "sub" / "report"), "demo",
                      f"--out '{places / 'file.txt' / 'sub' / 'report'}': '{places / 'file.txt'}' is a file, not a folder")


def test_demo_leaves_no_folder_behind_when_the_model_is_wrong(tmp_path):
    assert_user_error(glassbox("demo", "--model", "nosuch", "--out", tmp_path / "report"), "demo", "nosuch")
    assert not (tmp_path / "report").exists()


def test_demo_out_folder_holding_a_folder_where_the_report_goes(tmp_path):
    (tmp_path / "report" / "index.html").mkdir(parents=True)
    assert_user_error(glassbox("demo", "--out", tmp_path / "report"), "demo", "holds a folder named index.html")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_out_in_a_folder_that_is_not_writable(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert_user_error(glassbox("demo", "--out", locked / "report"), "demo", "is not writable")
        assert_user_error(glassbox("attention", "--prompt", "x", "--out", locked / "v.html"), "attention",
                          "is not writable")
    finally:
        locked.chmod(0o700)


def test_attention_out_must_be_a_file_in_a_folder(places):
    assert_user_error(glassbox("attention", "--prompt", "x", "--out", places / "empty"), "attention",
                      f"--out '{places / 'empty'}' is a folder", "give a file name")
    assert_user_error(glassbox("attention", "--prompt", "x", "--out", places / "file.txt" / "v.html"), "attention",
                      "is a file, not a folder")


# --- demo: answer and distractor ----------------------------------------------------------------------

def test_demo_answer_and_distractor_must_be_single_distinct_word_tokens(tmp_path):
    out = ["--out", tmp_path / "o"]
    assert_user_error(glassbox("demo", "--answer", " lettering", *out), "demo",
                      "--answer ' lettering' is 2 tokens for this model's tokenizer (' letter' 'ing')",
                      "give a single-token word such as ' letter'")
    assert_user_error(glassbox("demo", "--distractor", "", *out), "demo", "--distractor '' is 0 tokens")
    assert_user_error(glassbox("demo", "--answer", "<|endoftext|>", *out), "demo",
                      "--answer '<|endoftext|>' is the tokenizer's special token")
    assert_user_error(glassbox("demo", "--distractor", " letter", *out), "demo",
                      "--distractor ' letter' is the answer's token", "such as ' garden'")
    assert_user_error(glassbox("demo", "--prompt", "Jane walked to the window.", *out), "demo",
                      "--prompt does not contain the answer ' letter' as a token", "--answer")


def test_demo_on_a_trained_folder_names_the_values_that_cannot_work(trained, tmp_path):
    out = ["--out", tmp_path / "o"]
    line = assert_user_error(glassbox("demo", "--model", trained, "--answer", " letter", *out), "demo",
                             "--answer ' letter' is", "tokens for this model's tokenizer", "such as")
    assert "' the'" in line, line  # one of this tokenizer's single-token words
    assert_user_error(glassbox("demo", "--model", trained, "--prompt", "Jane read it. Jane read", *out), "demo",
                      "--answer not given, and the default ' letter' is", "give --answer")


def test_demo_on_a_trained_folder_chooses_words_its_tokenizer_can_express(trained, tmp_path):
    from glassbox.models import HookedTransformer

    out = tmp_path / "report"
    run = glassbox("demo", "--model", trained, "--out", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == ""
    summary = json.loads((out / "summary.json").read_text())
    answer, distractor, prompt = (summary["logit_lens"]["answer"], summary["logit_lens"]["distractor"],
                                  summary["prompt"])
    assert f"chose answer {answer!r} (the default ' letter' is" in run.stdout
    assert f"chose distractor {distractor!r} (the default ' garden' is" in run.stdout
    assert f"chose prompt {prompt!r} (the default prompt is" in run.stdout and "n_ctx=19" in run.stdout
    model = HookedTransformer.from_pretrained(str(trained))
    answer_id, distractor_id = model.to_single_token(answer), model.to_single_token(distractor)
    tokens = model.to_tokens(prompt)[0].tolist()
    assert len(tokens) <= 19 and tokens.count(answer_id) == 1 and distractor_id not in tokens
    assert summary["tokens"][summary["patching"]["corrupted_position"]] == answer
    assert summary["induction_seq_len"] == 9  # BOS + 2 x 9 fits n_ctx 19
    # The choice depends on the tokenizer alone.
    from glassbox.cli.demo import choose_story

    for _ in range(2):
        assert choose_story(model, None, None, None)[:3] == (prompt, answer, distractor)


def test_demo_on_a_trained_folder_with_values_it_can_express(trained, tmp_path):
    out = tmp_path / "report"
    run = glassbox("demo", "--model", trained, "--prompt", "Jane read the. Jane read", "--answer", " the",
                   "--distractor", " and", "--out", out)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "chose" not in run.stdout
    assert "logit difference ' the' - ' and'" in run.stdout


# --- the rest -----------------------------------------------------------------------------------------

def test_version():
    from glassbox import __version__

    run = glassbox("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"glassbox {__version__}", (run.stdout, run.stderr)


def test_a_reader_that_goes_away_is_no_traceback(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "glassbox", "attention", "--model", "random", "--prompt", "a b",
                             "--out", str(tmp_path / "v.html")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # like `glassbox attention ... | head -0`
    _, err = proc.communicate(timeout=300)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err[-3000:]
    assert proc.returncode == 1
