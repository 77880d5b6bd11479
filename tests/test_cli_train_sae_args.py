"""``glassbox train-sae`` checks every argument before it loads the model (or trains anything): each
mistake is one line ``glassbox train-sae: error: ...`` naming the argument, exit status 2, and no
model loaded (``load_model`` is replaced by one that fails the test) and nothing written."""

import json
from pathlib import Path

import pytest

import glassbox.cli.train_sae as cli
from glassbox.cli import main

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
HOOK = "blocks.0.hook_resid_post"
ARGS = ["--hook", HOOK, "--d-sae", "64", "--k", "4", "--steps", "4", "--batch-tokens", "128", "--context-size", "32",
        "--no-progress"]


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "austen.txt"
    path.write_text(AUSTEN.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    return path


@pytest.fixture
def no_model(monkeypatch):
    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "load_model", load_model)


def refused(argv, capsys):
    try:
        code = main(["train-sae", *argv])
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("glassbox train-sae: error: ") or err.startswith("usage:"), err
    assert err.count("\n") == (1 if err.startswith("glassbox") else err.count("\n")), err
    return err.splitlines()[-1]


def with_args(text, **changes):
    args = ["--text", str(text), *ARGS]
    for flag, value in changes.items():
        flag = "--" + flag.replace("_", "-")
        if flag in args:
            at = args.index(flag)
            del args[at:at + 2]
        if value is not None:
            args += [flag, value]
    return args


CASES = [
    (dict(hook="blocks.0.hook_resid_pst"), "--hook 'blocks.0.hook_resid_pst' is not a hook"),
    (dict(hook="blocks.9.hook_resid_post"), "--hook 'blocks.9.hook_resid_post' is not a hook"),
    (dict(k="100"), "--k=100 is more than --d-sae=64"),
    (dict(context_size="500"), "--context-size=500 is more than the model's n_ctx=128"),
    (dict(lr_warmup_steps="3", lr_decay_steps="3"), "--lr-warmup-steps (3) + --lr-decay-steps (3) is more than --steps"),
    (dict(architecture="standard"), "--k is for --architecture topk"),
    (dict(hook=None), "--hook is required"),
    (dict(d_sae=None), "--d-sae is required"),
    (dict(k=None), "--k is required with --architecture topk"),
    (dict(model="no-such-model"), "--model 'no-such-model' is not a known model"),
]


@pytest.mark.parametrize("changes,message", CASES, ids=[m.split()[0] + str(i) for i, (_, m) in enumerate(CASES)])
def test_setting_mistakes_are_refused_before_the_model_loads(text, tmp_path, capsys, no_model, changes, message):
    out = tmp_path / "run"
    line = refused(["--out", str(out), *with_args(text, **changes)], capsys)
    assert message in line, line
    assert not out.exists()


def test_out_a_file_or_under_a_file_is_refused_before_the_model_loads(text, tmp_path, capsys, no_model):
    (tmp_path / "file").write_text("x")
    for out, message in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "run", "is under a file"),
                         (tmp_path / "file" / "a" / "b", "is under a file")):
        line = refused(["--out", str(out), *with_args(text)], capsys)
        assert f"--out {out}" in line and message in line, line
    assert (tmp_path / "file").read_text() == "x"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    assert "is not empty" in refused(["--out", str(tmp_path / "full"), *with_args(text)], capsys)


@pytest.mark.parametrize("content,message", [(b"", "is empty"), (b"  \n\n\t\n", "is empty"),
                                             (b"caf\xe9 au lait\n" * 50, "is not UTF-8 text"),
                                             (b"one line without a break", "cannot cut a held-out")])
def test_bad_text_files_are_refused_before_the_model_loads(tmp_path, capsys, no_model, content, message):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    line = refused(["--out", str(tmp_path / "run"), *with_args(path)], capsys)
    assert f"--text {path}" in line and message in line, line
    line = refused(["--out", str(tmp_path / "run"), *with_args(tmp_path)], capsys)
    assert "is a folder" in line


def test_missing_required_arguments_are_argparse_refusals(text, tmp_path, capsys, no_model):
    assert "the following arguments are required: --text" in refused(["--out", str(tmp_path / "r"), *ARGS], capsys)
    assert "the following arguments are required: --out" in refused(["--text", str(text), *ARGS], capsys)
    assert "'0' is not a whole number >= 1" in refused(["--out", str(tmp_path / "r"), *with_args(text, d_sae="0")],
                                                       capsys)


def test_resume_with_other_settings_is_refused_before_the_model_loads(text, tmp_path, capsys, no_model):
    out = tmp_path / "run"
    out.mkdir()
    settings = {"train_config": {"hook_name": HOOK, "d_sae": 64, "k": 4, "architecture": "topk", "steps": 4,
                                 "batch_tokens": 128, "context_size": 32}, "dtype": "float32"}
    (out / "train_sae_settings.json").write_text(json.dumps(settings))
    line = refused(["--text", str(text), "--out", str(out), "--resume", "--k", "5", "--no-progress"], capsys)
    assert "--resume with --k=5, but the run in" in line and "has --k=4" in line, line
    line = refused(["--text", str(text), "--out", str(out), "--resume", "--hook", "blocks.1.hook_resid_post"], capsys)
    assert "--hook='blocks.1.hook_resid_post', but the run" in line, line


def test_too_short_a_held_out_part_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import glassbox.train.sae.api as api

    def train_sae(*args, **kwargs):
        raise AssertionError("trained before the held-out part was checked")

    monkeypatch.setattr(api, "train_sae", train_sae)
    path = tmp_path / "t.txt"
    text = AUSTEN.read_text(encoding="utf-8")[:20_000].rstrip() + "\nA short tail.\n"  # held out: the last line
    path.write_text(text, encoding="utf-8")
    line = refused(["--out", str(tmp_path / "run"), *with_args(path, heldout_frac=str(16 / len(text)))], capsys)
    assert "the held-out part holds fewer than 31 tokens" in line, line
    assert not (tmp_path / "run").exists()
