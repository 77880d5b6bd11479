"""The shipped default model ``glassbox-austen``: loads offline, matches ``transformers`` on its
trained weights, beats a unigram model on held-out Austen, and has the induction head its model
card reports, which stops working when the previous-token head it reads from is ablated. The
pinned numbers are the ones measured when the model was shipped (see the card).
"""

from pathlib import Path

import pytest
import torch

from glassbox.interp.heads import induction_score, induction_tokens
from glassbox.models import HookedTransformer
from glassbox.train import encode_text, split_text
from glassbox.weights.pretrained import SHIPPED_DIR

NAME = "glassbox-austen"
FOLDER = SHIPPED_DIR / NAME
AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"

# Measured on the shipped weights (see the model card). Induction scores [layer head] on 2 x 20
# random tokens after a BOS, batch 8, seed 0: layer 1 head 0 is an induction head. Held-out loss:
# the first 16 held-out windows of 128 tokens.
INDUCTION_SCORES = [[0.0103, 0.0192, 0.0011], [0.8168, 0.0243, 0.0142]]
HELDOUT_LOSS_16 = 3.7245
INDUCTION_HEAD = (1, 0)
PREVIOUS_TOKEN_HEAD = (0, 2)


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
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)  # measured 9.5e-6 (logits up to 17.1); 10x


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
    assert loss.item() == pytest.approx(HELDOUT_LOSS_16, abs=2e-3)  # measured 1.6e-5 off the pinned value


def test_induction_scores_are_pinned(model):
    scores = induction_score(model, 20, n_repeats=2, batch=8, seed=0, bos_token_id=model.tokenizer.eos_token_id)
    # measured 5.0e-5 (values up to 0.82), bound 0.001: 20x
    torch.testing.assert_close(scores, torch.tensor(INDUCTION_SCORES), atol=1e-3, rtol=0)


def test_it_has_an_induction_head(model):
    scores = induction_score(model, 20, n_repeats=2, batch=8, seed=0, bos_token_id=model.tokenizer.eos_token_id)
    layer, head = INDUCTION_HEAD
    assert scores[layer, head] > 0.5
    assert scores.flatten().argmax().item() == layer * model.cfg.n_heads + head


def repeat_loss(model, tokens, length):
    """Mean next-token loss on the second copy of a repeated random segment."""
    log_probs = model(tokens).log_softmax(-1)[:, :-1]
    nll = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    return nll[:, :length - 1].mean().item(), nll[:, length:].mean().item()


def test_the_induction_head_needs_the_previous_token_head(model):
    """Zeroing layer 0 head 2's output breaks induction; zeroing either other layer-0 head does not."""
    bos = model.tokenizer.eos_token_id
    tokens = induction_tokens(model, 50, batch=8, seed=0, bos_token_id=bos)
    with torch.no_grad():
        first, second = repeat_loss(model, tokens, 50)
    assert second < 1.0 < 8.0 < first  # the repeat is predicted; the first copy is not (uniform: 8.32)
    for head in range(model.cfg.n_heads):
        def zero(z, hook, head=head):
            z = z.clone()
            z[:, :, head] = 0.0
            return z

        with torch.no_grad(), model.hooks([("blocks.0.attn.hook_z", zero)]):
            _, ablated = repeat_loss(model, tokens, 50)
            scores = induction_score(model, 20, n_repeats=2, batch=8, seed=0, bos_token_id=bos)
        if (0, head) == PREVIOUS_TOKEN_HEAD:
            assert ablated > 8.0 and scores.max() < 0.1, (head, ablated, scores.max())
        else:
            assert ablated < 1.0 and scores[INDUCTION_HEAD] > 0.5, (head, ablated, scores[INDUCTION_HEAD])
