"""`glassbox demo`: the report's files, and its numbers checked against identities that must hold."""

import json
import subprocess
import sys

import pytest
import torch

from glassbox.models import HookedTransformer
from glassbox.weights import hub_config

PROMPT = "Elizabeth read the letter again, and then walked to the window. When Jane came in, Elizabeth read the"


@pytest.fixture(scope="module")
def gpt2_vocab_folder(tmp_path_factory):
    torch.manual_seed(3)
    model = HookedTransformer(hub_config("gpt2").replace(n_layers=2, d_model=24, n_heads=3, n_ctx=64))
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder)
    return folder


def test_demo_writes_report_whose_numbers_hold(gpt2_vocab_folder, tmp_path):
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "glassbox", "demo", "--model", str(gpt2_vocab_folder), "--prompt", PROMPT,
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"report: {out / 'index.html'}" in run.stdout
    html = (out / "index.html").read_text()
    assert "<script src=" not in html and 'src="http' not in html, "the report must load nothing from the network"
    assert "Plotly.newPlot" in html and len(html) > 3_000_000, "plotly.js is inlined"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parity_worst_relative"] <= 1e-5  # measured 1.7e-7 (a relative difference): 57x
    assert len(summary["parity"]) == 2 * 2 + 2
    n_tokens = len(summary["tokens"])
    values = torch.tensor(summary["patching"]["values"])
    assert values.shape == (2, n_tokens)
    replaced = summary["patching"]["corrupted_position"]
    assert summary["tokens"][replaced] == " letter"
    # Corrupted and clean prompts differ only at one position: patching the residual stream entering
    # layer 0 there gives back the clean run (normalised metric 1), anywhere else the corrupted run (0).
    # measured 0 (values up to 1), bound 0.0001: exact here
    torch.testing.assert_close(values[0, replaced], torch.tensor(1.0), atol=1e-4, rtol=0)
    others = torch.cat([values[0, :replaced], values[0, replaced + 1:]])
    # measured 0 (values up to 0), bound 0.0001: exact here
    torch.testing.assert_close(others, torch.zeros_like(others), atol=1e-4, rtol=0)
    # Before the corrupted position, nothing differs at any layer.
    # measured 8.5e-6 (values up to 0), bound 0.0001: 12x
    torch.testing.assert_close(values[:, :replaced], torch.zeros(2, replaced), atol=1e-4, rtol=0)
    heads = summary["induction_heads"]
    assert len(heads) == 5 and all(0.0 <= h["score"] <= 1.0 for h in heads)
    assert heads == sorted(heads, key=lambda h: -h["score"])


def test_shipped_model_is_every_commands_default():
    from glassbox.cli import build_parser

    parser = build_parser()
    for argv in (["demo"], ["parity"], ["attention", "--prompt", "x"]):
        assert parser.parse_args(argv).model == "glassbox-austen", argv
