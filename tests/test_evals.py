"""Evaluations: IOI prompts and logit differences, loss on repeated random tokens, mean loss, loaders.

The shipped model has an induction circuit (its card: layer 1 head 0 reads layer 0 head 2), so its
loss on the repeat of random tokens must be far below the same tokens with the repeat shuffled.
"""

import random
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from glassbox import HookedTransformer
from glassbox.interp.evals import (ioi_logit_diffs, ioi_target, mean_loss_over_batches, repeated_tokens,
                                   repeated_tokens_loss)
from glassbox.interp.ioi_data import IOIDataset
from glassbox.tl import evals
from glassbox.tl import utils as tl_utils

NAMES = ["Elizabeth", "Jane", "Mary", "Charlotte", "Lydia"]


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


# -- IOI -------------------------------------------------------------------------------------------
def test_ioi_dataset_structure(model):
    tok = model.tokenizer
    state = random.getstate()
    ds = IOIDataset(tok, num_samples=30, seed=4)
    assert random.getstate() == state  # a seed does not touch the global generator
    assert len(ds) == 30 and ds.names == ["John", "Mary"]
    for sample in ds.samples:
        text, io, s = sample["text"], sample["IO"], sample["S"]
        assert io != s and {io, s} == {" John", " Mary"}
        filled = {t.replace("[A]", io.strip()).replace("[B]", s.strip()).replace("[LOCATION]", place)
                  .replace("[OBJECT]", thing) for t in IOIDataset.get_default_templates()
                  for place in ("store", "market") for thing in ("milk", "eggs", "bread")}
        assert text in filled and text.endswith(io.strip())
    objects = re.findall(r"(milk|eggs|bread)", ds.samples[0]["text"])
    assert len(set(objects)) == 1  # one noun per placeholder, the same at each occurrence
    item = ds[0]
    assert set(item) == {"prompt", "IO", "S"} and item["prompt"].dtype == torch.long
    assert item["prompt"][0] == tok.bos_token_id
    assert item["prompt"][1:].tolist() == tok.encode(ds.samples[0]["text"], add_special_tokens=False)
    assert item["IO"].tolist() == tok.encode(ds.samples[0]["IO"], add_special_tokens=False)
    assert IOIDataset(tok, num_samples=30, seed=4).samples == ds.samples
    assert IOIDataset(tok, num_samples=30, seed=5).samples != ds.samples
    assert IOIDataset(tok, num_samples=3, prepend_bos=False, seed=4)[0]["prompt"][0] != tok.bos_token_id


def test_ioi_dataset_symmetric_pairs_swap_the_names(model):
    ds = IOIDataset(model.tokenizer, names=NAMES, num_samples=9, symmetric=True, seed=2)
    assert len(ds) == 8  # num_samples // 2 pairs
    for first, second in zip(ds.samples[::2], ds.samples[1::2]):
        assert (first["IO"], first["S"]) == (second["S"], second["IO"])
        a, b = first["IO"].strip(), first["S"].strip()
        assert second["text"] == first["text"].replace(a, "\0").replace(b, a).replace("\0", b)


@pytest.mark.parametrize("kwargs,match", [({"names": ["Ann"]}, "two distinct names"), ({"templates": []}, "template"),
                                          ({"nouns": {"OBJECT": []}}, "OBJECT"), ({"num_samples": -1}, "num_samples")])
def test_ioi_dataset_refusals(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        IOIDataset(model.tokenizer, **kwargs)


def test_ioi_target_by_hand():
    # names of two tokens sharing the first: the position that predicts the second token is scored
    item = {"prompt": torch.tensor([0, 11, 12, 13, 7, 8]), "IO": torch.tensor([7, 8]), "S": torch.tensor([7, 9])}
    assert ioi_target(item) == (4, 8, 9)
    single = {"prompt": torch.tensor([0, 11, 12, 5]), "IO": torch.tensor([5]), "S": torch.tensor([6, 2])}
    assert ioi_target(single) == (2, 5, 6)
    with pytest.raises(ValueError, match="share every token"):
        ioi_target({"prompt": torch.tensor([0, 7]), "IO": torch.tensor([7]), "S": torch.tensor([7, 3])})


def test_ioi_logit_diffs_equal_each_prompt_run_alone(model):
    ds = IOIDataset(model.tokenizer, names=NAMES, num_samples=10, seed=0)
    scores = ioi_logit_diffs(model, ds, batch_size=4)  # padded batches of prompts of different lengths
    alone = []
    for i in range(len(ds)):
        at, io, s = ioi_target(ds[i])
        with torch.no_grad():
            logits = model(ds[i]["prompt"][None])[0, at]
        alone.append(float(logits[io] - logits[s]))
    alone = torch.tensor(alone)
    assert scores.logit_diffs.shape == (10,)
    # measured 0 (|differences| up to 2.7), bound 1e-5
    assert float((scores.logit_diffs - alone).abs().max()) < 1e-5
    assert scores.accuracy == int((alone > 0).sum()) / 10
    result = evals.ioi_eval(model, ds, batch_size=3)
    assert result.keys() == {"Logit Difference", "Accuracy"}
    # measured 4.8e-8 (mean -0.91: a float64 mean against a float32 one), bound 1e-6: 21x
    assert abs(result["Logit Difference"] - float(alone.mean())) < 1e-6
    with pytest.raises(ValueError, match="empty"):
        ioi_logit_diffs(model, IOIDataset(model.tokenizer, num_samples=0))


# -- repeated random tokens ------------------------------------------------------------------------
def test_repeated_tokens_structure():
    tokens = repeated_tokens(3, 10, (100, 200), bos_token_id=7, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 20)  # the BOS overwrites the first id; the row is not longer
    assert (tokens[:, 0] == 7).all() and torch.equal(tokens[:, 11:], tokens[:, 1:10])
    assert ((tokens[:, 1:] >= 100) & (tokens[:, 1:] < 200)).all()
    first = torch.randint(100, 200, (3, 10), generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens[:, 10:], first) and torch.equal(tokens[:, 1:10], first[:, 1:])


def test_induction_loss_on_the_shipped_model_is_low_against_a_shuffled_repeat(model):
    loss = repeated_tokens_loss(model, 4, 60, token_range=(100, 4000), generator=torch.Generator().manual_seed(0))
    tokens = repeated_tokens(4, 60, (100, 4000), model.bos_token_id, torch.Generator().manual_seed(0))
    control = tokens.clone()  # the same ids, the repeat in a shuffled order: nothing to copy from position
    control[:, 60:] = tokens[:, 60:][:, torch.randperm(60, generator=torch.Generator().manual_seed(1))]

    def second_half_loss(t):  # by hand, with F.cross_entropy: per-token positions 61.. of 119
        with torch.no_grad():
            logits = model(t)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1), reduction="none")
        return float(ce.view(t.shape[0], -1)[:, 61:].mean())

    # measured 0 (the same float32 log-softmax), bound 1e-5 (loss 0.077)
    assert abs(float(loss) - second_half_loss(tokens)) < 1e-5
    # measured 0.077 nats on the repeat and 12.9 on the shuffled control (ln 4096 = 8.3 is chance)
    assert float(loss) < 0.5 and second_half_loss(control) > 8.0
    torch.manual_seed(3)
    tl_loss = evals.induction_loss(model, batch_size=4, subseq_len=60, token_range=(100, 4000))
    torch.manual_seed(3)
    assert float(tl_loss) == float(repeated_tokens_loss(model, 4, 60, token_range=(100, 4000)))


@pytest.mark.parametrize("kwargs,match", [({"subseq_len": 65}, "n_ctx=128"), ({"subseq_len": 2}, "subseq_len >= 3"),
                                          ({"token_range": (100, 5000)}, "d_vocab=4096"),
                                          ({"batch_size": 0}, "batch_size")])
def test_repeated_tokens_loss_refusals(model, kwargs, match):
    options = {"subseq_len": 20, "token_range": (100, 4000), **kwargs}
    with pytest.raises(ValueError, match=match):
        repeated_tokens_loss(model, **options)


def test_tl_induction_loss_asks_for_a_token_range_below_20000_ids(model):
    with pytest.raises(ValueError, match="token_range"):
        evals.induction_loss(model, subseq_len=20)


# -- mean loss, loaders ----------------------------------------------------------------------------
def test_mean_loss_over_batches_by_hand(model, tmp_path):
    text = "\n\n".join(f"Elizabeth walked to the garden for the {i}th time, and Jane read the letter." for i in range(12))
    path = tmp_path / "text.txt"
    path.write_text(text)
    loader = evals.make_text_data_loader(path, model.tokenizer, batch_size=3, max_length=24)
    batches = list(loader)
    assert all(b["tokens"].shape == (3, 24) for b in batches) and len(batches) >= 3
    with torch.no_grad():
        by_hand = [float(tl_utils.lm_cross_entropy_loss(model(b["tokens"]), b["tokens"])) for b in batches]
    # the same forward passes: measured 0, bound 1e-6 (losses 5.1 to 5.5)
    assert abs(mean_loss_over_batches(model, batches) - sum(by_hand) / len(by_hand)) < 1e-6
    assert abs(evals.evaluate_on_dataset(model, batches, truncate=1) - sum(by_hand[:2]) / 2) < 1e-6  # truncate + 1
    with pytest.raises(ValueError, match="no batches"):
        mean_loss_over_batches(model, [])


@pytest.mark.parametrize("loader,name", [(evals.make_wiki_data_loader, "wikitext"),
                                         (evals.make_owt_data_loader, "stas/openwebtext-10k"),
                                         (evals.make_pile_data_loader, "NeelNanda/pile-10k"),
                                         (evals.make_code_data_loader, "codeparrot")])
def test_hub_loaders_without_datasets_name_the_dataset_and_the_way_out(model, monkeypatch, loader, name):
    monkeypatch.setitem(sys.modules, "datasets", None)  # the optional extra absent
    with pytest.raises(ImportError, match=re.escape(name) + ".*make_text_data_loader"):
        loader(model.tokenizer)


def test_sanity_check(model):
    # measured 6.12: the card gives 3.91 nats held out on Austen; this paragraph is not Austen, but far from
    # chance (ln 4096 = 8.3)
    with torch.no_grad():
        assert 3.0 < float(evals.sanity_check(model)) < 7.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_evals_and_helpers_run_on_cuda(model):
    gpu = HookedTransformer.from_pretrained("glassbox-austen", device="cuda")
    loss = repeated_tokens_loss(gpu, 2, 30, token_range=(100, 4000), generator=torch.Generator().manual_seed(0))
    assert loss.device.type == "cuda" and float(loss) < 0.5  # as on the CPU (0.08 there with 4 rows of 60)
    ds = IOIDataset(gpu.tokenizer, names=NAMES, num_samples=4, seed=0)
    assert ioi_logit_diffs(gpu, ds, 3).logit_diffs.device.type == "cuda"
    t = torch.arange(12, device="cuda").reshape(3, 4)
    assert torch.equal(tl_utils.Slice(torch.tensor([2, 0])).apply(t, 1).cpu(), torch.tensor([[2, 0], [6, 4], [10, 8]]))
    assert tl_utils.lm_accuracy(torch.zeros(1, 3, 5, device="cuda"), torch.zeros(1, 3, dtype=torch.long,
                                                                                device="cuda")).item() == 1.0
