"""The shipped default model ``glassbox-austen``: loads offline, matches ``transformers`` on its
trained weights, beats a unigram model on held-out Austen, and has the induction head its model
card reports. The pinned numbers are the ones measured when the model was trained (see the card).
"""

from pathlib import Path

import pytest
import torch

from glassbox.interp.heads import induction_score
from glassbox.models import HookedTransformer
from glassbox.train import encode_text, split_text
from glassbox.weights.pretrained import SHIPPED_DIR

NAME = "glassbox-austen"
FOLDER = SHIPPED_DIR / NAME
AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"

# Measured on the shipped weights (see the model card). Induction scores [layer head] on 2 x 20
# random tokens after a BOS, batch 8, seed 0: this model has NO induction head (all < 0.05; the
# card says so). Held-out loss: the first 16 held-out windows of 128 tokens.
INDUCTION_SCORES = [[0.0069, 0.0044, 0.0081, 0.0023], [0.0290, 0.0417, 0.0404, 0.0355]]
HELDOUT_LOSS_16 = 4.1286


@pytest.fixture(scope="module")
def model(monkeypatch_module):
    return HookedTransformer.from_pretrained(NAME)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # nothing may come from the network
        yield mp


@pytest.fixture(scope="module")
def heldout_windows(model):
    _, heldout = split_text(AUSTEN.read_text(encoding="utf-8"), 0.05)
    stream = encode_text(heldout, model.tokenizer)
    n = model.cfg.n_ctx
    body = stream[: 16 * n].view(16, n)
    bos = torch.full((16, 1), model.tokenizer.eos_token_id)
    return torch.cat([bos, body], dim=1), stream


def test_shipped_folder_is_small_and_complete():
    files = {p.name: p.stat().st_size for p in FOLDER.iterdir() if p.is_file()}
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt", "README.md"):
        assert name in files, f"{name} missing from {FOLDER}"
    assert sum(files.values()) <= 10 * 2**20, f"shipped model is {sum(files.values()) / 2**20:.1f} MB"


def test_loads_offline_by_name_with_its_own_tokenizer(model):
    assert model.cfg.n_layers >= 2
    assert len(model.tokenizer) == model.cfg.d_vocab
    ids = model.to_tokens(PROMPT, prepend_bos=False)[0].tolist()
    assert model.to_string(ids) == PROMPT
    assert len(ids) < len(PROMPT.split()) * 2, "the Austen BPE should spend about a token per word"


def test_logits_match_transformers_on_the_trained_weights(model):
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(str(FOLDER), attn_implementation="eager").eval()
    tokens = model.to_tokens(PROMPT)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert theirs.abs().max().item() > 5.0, "trained logits should be far from the tiny initial ones"
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)


def test_greedy_continuation_matches_transformers(model):
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(str(FOLDER), attn_implementation="eager").eval()
    tokens = model.to_tokens(PROMPT)
    ours = model.generate(tokens, max_new_tokens=12)
    with torch.no_grad():
        theirs = hf.generate(tokens, max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(tokens),
                             pad_token_id=model.tokenizer.eos_token_id)
    assert ours.tolist() == theirs.tolist()


def test_heldout_loss_clearly_beats_the_best_unigram_model(model, heldout_windows):
    windows, _ = heldout_windows
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
    # Oracle baseline: the entropy of these very targets' own unigram frequencies, which is the best
    # loss any unigram model could reach on them (a model trained on other text does worse).
    counts = torch.bincount(windows[:, 1:].flatten()).double()
    p = counts[counts > 0] / counts.sum()
    unigram = -(p * p.log()).sum().item()
    assert loss.item() < unigram - 1.0, (loss.item(), unigram)
    assert loss.item() == pytest.approx(HELDOUT_LOSS_16, abs=2e-3)


def test_induction_scores_are_pinned(model):
    scores = induction_score(model, 20, n_repeats=2, batch=8, seed=0, bos_token_id=model.tokenizer.eos_token_id)
    torch.testing.assert_close(scores, torch.tensor(INDUCTION_SCORES), atol=1e-3, rtol=0)
