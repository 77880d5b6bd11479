"""``glassbox train-sae`` end to end on glassbox-austen and a slice of Austen: the folder it writes,
its evals (those of the saved SAE on the held-out windows), resume, and one-line errors naming the
argument."""

import json
from pathlib import Path

import pytest
import torch

from glassbox.cli import main
from glassbox.interp.sae.evals import evaluate_sae
from glassbox.interp.sae.format import load_sae
from glassbox.models import HookedTransformer
from glassbox.train.data import encode_text, split_text

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
HOOK = "blocks.0.hook_resid_post"
ARGS = ["--hook", HOOK, "--d-sae", "64", "--k", "4", "--steps", "4", "--batch-tokens", "128", "--context-size", "32",
        "--checkpoint-every", "2", "--buffer-batches", "2", "--model-batch", "4", "--eval-windows", "6", "--seed", "3",
        "--lr", "1e-3", "--no-progress"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "austen.txt"
    path.write_text(AUSTEN.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("sae") / "run"
    assert main(["train-sae", "--text", str(text), "--out", str(out), *ARGS]) == 0
    return out


def test_folder_and_evals_are_those_of_the_saved_sae(run, text):
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "evals.json", "sae", "train_sae_log.jsonl",
                                                     "train_sae_settings.json"]
    record = json.loads((run / "evals.json").read_text())
    model = HookedTransformer.from_pretrained("glassbox-austen")
    sae = load_sae(run / "sae")
    assert sae.cfg.architecture == "topk" and sae.cfg.k == 4 and sae.cfg.d_sae == 64 and sae.cfg.hook_name == HOOK
    # The held-out windows, rebuilt: the text's last 5% (cut at a line break), [BOS] + 31 tokens each.
    _, heldout = split_text(text.read_text(encoding="utf-8"), 0.05)
    stream = encode_text(heldout, model.tokenizer)
    bos = model.tokenizer.bos_token_id
    windows = torch.stack([torch.cat([torch.tensor([bos]), stream[i * 31:(i + 1) * 31]]) for i in range(6)])
    assert record["eval_windows"] == 6 and record["context_size"] == 32
    expected = evaluate_sae(model, sae, windows, feature_density=True)
    assert record["feature_density"] == expected.pop("feature_density") and len(record["feature_density"]) == 64
    assert expected == record["evals"]
    assert record["evals"]["l0"] == 4.0 and record["evals"]["n_tokens"] == 6 * 31
    log = [json.loads(line) for line in (run / "train_sae_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]


def test_resume_of_a_finished_run_keeps_the_sae(run, text, capsys):
    before = (run / "sae" / "sae_weights.safetensors").read_bytes()
    assert main(["train-sae", "--text", str(text), "--out", str(run), "--resume", "--eval-windows", "6",
                 "--no-progress"]) == 0
    assert (run / "sae" / "sae_weights.safetensors").read_bytes() == before
    printed = capsys.readouterr().out
    assert "resuming" in printed and "ce_loss_score" in printed and "explained_variance" in printed
    assert main(["train-sae", "--text", str(text), "--out", str(run), "--resume", "--k", "5", "--no-progress"]) == 2
    assert "--k=5, but the run" in capsys.readouterr().err


def test_help_names_every_setting(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train-sae", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--model", "--text", "--hook", "--d-sae", "--architecture", "--k", "--l1-coefficient", "--steps",
                 "--batch-tokens", "--lr", "--seed", "--out", "--resume", "--device", "--dtype", "--heldout-frac"):
        assert flag in shown, flag


@pytest.mark.parametrize("change,message", [
    ({"--hook": None}, "--hook is required"),
    ({"--k": None}, "--k is required with --architecture topk"),
    ({"--architecture": "standard"}, "--k is for --architecture topk"),
    ({"--hook": "blocks.0.hook_resid_pst"}, "--hook 'blocks.0.hook_resid_pst' is not a hook"),
    ({"--k": "100"}, "--k=100 is more than --d-sae=64"),
    ({"--context-size": "500"}, "--context-size=500 is more than the model's n_ctx=128"),
    ({"--batch-tokens": "0"}, "argument --batch-tokens: '0' is not a whole number >= 1"),
    ({"--heldout-frac": "1.5"}, "argument --heldout-frac: '1.5' is not a number in (0, 1)"),
    ({"--architecture": "relu"}, "argument --architecture: invalid choice"),
    ({"--model": "no-such-model"}, "--model 'no-such-model' is not a known model"),
    ({"--text": "missing.txt"}, "--text missing.txt: no such file"),
])
def test_mistakes_are_one_line_naming_the_argument(text, tmp_path, capsys, change, message):
    args = ["--text", str(text), *ARGS]
    for flag, value in change.items():
        if flag in args:
            at = args.index(flag)
            del args[at:at + 2]
        if value is not None:
            args += [flag, value if flag != "--text" else str(tmp_path / value)]
    message = message.replace("missing.txt", str(tmp_path / "missing.txt"))
    out = tmp_path / "run"
    try:
        code = main(["train-sae", "--out", str(out), *args])
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_out_must_be_a_new_or_empty_folder(text, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    for out, message in ((tmp_path / "file", "is a file"), (tmp_path / "full", "is not empty; add --resume")):
        assert main(["train-sae", "--text", str(text), "--out", str(out), *ARGS]) == 2
        assert message in capsys.readouterr().err
    assert main(["train-sae", "--text", str(text), "--out", str(tmp_path / "none"), "--resume", "--no-progress"]) == 2
    assert "holds no SAE training run" in capsys.readouterr().err
