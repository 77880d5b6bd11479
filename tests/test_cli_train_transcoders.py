"""``glassbox train-sae --transcoders`` end to end on glassbox-austen and a slice of Austen: the folder it
writes, its evals (those of the saved set on the held-out windows), resume, and one-line errors."""

import json
from pathlib import Path

import pytest
import torch

from glassbox.cli import main
from glassbox.interp.transcoders import load_circuit_tracer
from glassbox.interp.transcoders.evals import evaluate_transcoders
from glassbox.models import HookedTransformer
from glassbox.train.data import encode_text, split_text

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
ARGS = ["--transcoders", "cross-layer", "--d-sae", "48", "--architecture", "standard", "--l1-coefficient", "0.1",
        "--steps", "4", "--batch-tokens", "128", "--context-size", "32", "--checkpoint-every", "2",
        "--buffer-batches", "2", "--model-batch", "4", "--eval-windows", "6", "--seed", "3", "--lr", "1e-3",
        "--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "austen.txt"
    path.write_text(AUSTEN.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("tc") / "run"
    assert main(["train-sae", "--text", str(text), "--out", str(out), *ARGS]) == 0
    return out


def test_folder_and_evals_are_those_of_the_saved_set(run, text):
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "evals.json", "train_sae_log.jsonl",
                                                     "train_sae_settings.json", "transcoders"]
    ts = load_circuit_tracer(run / "transcoders")
    assert ts.cross_layer and ts.activation == "relu" and ts.d_transcoder == 48 and ts.n_layers == 2
    assert ts.feature_input_hook(1) == "blocks.1.ln2.hook_out" and ts.feature_output_hook(0) == "blocks.0.hook_mlp_out"
    model = HookedTransformer.from_pretrained("glassbox-austen")
    _, heldout = split_text(text.read_text(encoding="utf-8"), 0.05)
    stream = encode_text(heldout, model.tokenizer)
    bos = model.tokenizer.bos_token_id
    windows = torch.stack([torch.cat([torch.tensor([bos]), stream[i * 31:(i + 1) * 31]]) for i in range(6)])
    record = json.loads((run / "evals.json").read_text())
    assert record["eval_windows"] == 6 and record["context_size"] == 32
    assert evaluate_transcoders(model, ts, windows) == record["evals"]
    assert record["evals"]["n_tokens"] == 6 * 31 and len(record["evals"]["fvu"]) == 2
    log = [json.loads(line) for line in (run / "train_sae_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4]


def test_resume_of_a_finished_run_keeps_the_set(run, text, capsys):
    before = (run / "transcoders" / "W_dec_0.safetensors").read_bytes()
    assert main(["train-sae", "--text", str(text), "--out", str(run), "--resume", "--transcoders", "cross-layer",
                 "--eval-windows", "6", "--no-progress"]) == 0
    assert (run / "transcoders" / "W_dec_0.safetensors").read_bytes() == before
    assert "resuming" in capsys.readouterr().out
    assert main(["train-sae", "--text", str(text), "--out", str(run), "--resume", "--transcoders", "cross-layer",
                 "--steps", "5", "--no-progress"]) == 2
    assert "--resume with steps=5, but the run" in capsys.readouterr().err
    assert main(["train-sae", "--text", str(text), "--out", str(run), "--resume", "--transcoders", "per-layer",
                 "--no-progress"]) == 2
    assert "cross_layer=False, but the run" in capsys.readouterr().err


@pytest.mark.parametrize("change,message", [
    (["--hook", "blocks.0.hook_resid_post"], "--hook is for an SAE"),
    (["--k", "4"], "--k is for --architecture topk"),
    (["--architecture", "topk"], "--k is required with --architecture topk"),
    (["--input-hook", "ln2.hook_outt"], "input_hook='ln2.hook_outt' is not a per-block hook"),
])
def test_mistakes_are_one_line(text, tmp_path, capsys, change, message):
    args = list(ARGS)
    if change[0] == "--architecture":
        at = args.index("--architecture")
        del args[at:at + 2]
    out = tmp_path / "run"
    assert main(["train-sae", "--text", str(text), "--out", str(out), *args, *change]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()
    assert main(["train-sae", "--text", str(text), "--out", str(out), "--hook", "blocks.0.hook_resid_post",
                 "--d-sae", "8", "--k", "2", "--skip"]) == 2
    assert "--skip is for --transcoders" in capsys.readouterr().err
