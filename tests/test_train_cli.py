"""``glassbox train`` end to end on a small slice of Austen: the output folder is a Hugging Face
GPT-2 folder that ``transformers`` loads with the same logits and the same tokenizer ids."""

import json
from pathlib import Path

import pytest
import torch

from glassbox.cli import main
from glassbox.models import HookedTransformer

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
ARGS = ["--layers", "2", "--d-model", "15", "--heads", "3", "--n-ctx", "19", "--vocab-size", "307",
        "--steps", "6", "--batch-size", "3", "--eval-every", "3", "--checkpoint-every", "3", "--seed", "5",
        "--repeat-frac", "0.5", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    text = root / "text.txt"
    text.write_text(AUSTEN.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    out = root / "model"
    assert main(["train", "--text", str(text), "--out", str(out), *ARGS]) == 0
    return out


def test_folder_loads_in_transformers_with_equal_logits(trained):
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast

    hf = GPT2LMHeadModel.from_pretrained(str(trained)).eval()
    model = HookedTransformer.from_pretrained(str(trained))
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads, model.cfg.n_ctx, model.cfg.d_vocab) == \
        (2, 15, 3, 19, 307)
    hf_tok = GPT2TokenizerFast.from_pretrained(str(trained))
    ids = hf_tok.encode("It is a truth", add_special_tokens=False)
    assert len(ids) > 3 and model.to_tokens("It is a truth", prepend_bos=False)[0].tolist() == ids
    tokens = torch.tensor([[306] + ids])
    with torch.no_grad():
        # measured 6.0e-8 (values up to 0.79), bound 1e-5: 168x
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-5, rtol=0)


def test_summary_reports_heldout_and_unigram_loss(trained):
    summary = json.loads((trained / "train_summary.json").read_text())
    log = [json.loads(line) for line in (trained / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 7))
    assert summary["heldout_loss"] == log[-1]["eval_loss"]
    assert summary["steps"] == 6 and summary["tokens_seen"] == 6 * 3 * 19
    assert 3.0 < summary["unigram_heldout_loss"] < 5.73  # below uniform over 307 = ln 307
    assert summary["train_config"]["repeat_frac"] == 0.5


def test_resume_of_a_finished_run_keeps_the_weights(trained):
    before = (trained / "model.safetensors").read_bytes()
    text = trained.parent / "text.txt"
    assert main(["train", "--text", str(text), "--out", str(trained), "--resume", "--no-progress"]) == 0
    assert (trained / "model.safetensors").read_bytes() == before


def test_other_architectures_train_and_keep_their_checkpoint(tmp_path, trained):
    from glassbox.train import load_checkpoint

    out = tmp_path / "classic"
    assert main(["train", "--text", str(trained.parent / "text.txt"), "--out", str(out), "--arch", "classic",
                 *ARGS]) == 0
    cfg, state, _ = load_checkpoint(out / "checkpoint")
    assert cfg.positional == "sinusoidal" and cfg.norm_placement == "post" and cfg.n_layers == 2
    assert not (out / "model.safetensors").exists()


def test_untied_model_exports_with_its_own_unembedding(tmp_path, trained):
    from transformers import GPT2LMHeadModel

    out = tmp_path / "untied"
    args = ARGS[:ARGS.index("--steps")] + ["--steps", "2", "--batch-size", "2", "--no-progress", "--untied",
                                          "--init-range", "0.05"]
    assert main(["train", "--text", str(trained.parent / "text.txt"), "--out", str(out), *args]) == 0
    model = HookedTransformer.from_pretrained(str(out))
    hf = GPT2LMHeadModel.from_pretrained(str(out)).eval()
    assert not model.cfg.tied_unembed and not hf.config.tie_word_embeddings
    assert model.cfg.init_range == 0.05
    assert not torch.equal(model.W_U, model.W_E.T)
    tokens = torch.tensor([[306, 5, 17, 200, 42]])
    with torch.no_grad():
        # measured 6.0e-8 (values up to 0.79), bound 1e-5: 168x
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-5, rtol=0)
