"""MMLU read offline (glassbox.train.mmlu) from a hand-made hub cache of the bundled fixture, and the
multiple-choice score (glassbox.interp.multiple_choice) against a hand computation of each prompt."""

import json
from pathlib import Path

import pytest
import torch

from hub_cache import cache_mmlu

FIXTURE = json.loads((Path(__file__).parent / "data" / "mmlu_tiny.json").read_text())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    folder = tmp_path / "hub"
    cache_mmlu(folder, FIXTURE)
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))  # empty: the hub cache is what is read
    return folder


def test_questions_come_back_as_the_fixture_holds_them_in_order(cache):
    from glassbox.train.mmlu import load_mmlu

    rows = load_mmlu("abstract_algebra")
    assert rows == [dict(r, subject="abstract_algebra") for r in FIXTURE["abstract_algebra"]]
    two = load_mmlu(["anatomy", "abstract_algebra"], num_samples=3)
    assert [r["subject"] for r in two] == ["anatomy"] * 3 + ["abstract_algebra"] * 3
    assert [r["question"] for r in two[:3]] == [r["question"] for r in FIXTURE["anatomy"][:3]]
    assert len(load_mmlu("anatomy", num_samples=100)) == len(FIXTURE["anatomy"])


def test_bad_subjects_splits_and_counts_are_named(cache):
    from glassbox.train.mmlu import load_mmlu

    with pytest.raises(ValueError, match=r"Invalid subject\(s\): 'anatomyy'.*did you mean 'anatomy'"):
        load_mmlu("anatomyy")
    with pytest.raises(ValueError, match="subjects is empty"):
        load_mmlu([])
    with pytest.raises(ValueError, match="split='tset' is not one of MMLU's splits"):
        load_mmlu("anatomy", split="tset")
    for bad in (0, -1, 2.0, True):
        with pytest.raises((ValueError, TypeError), match="num_samples"):
            load_mmlu("anatomy", num_samples=bad)


def test_a_subject_in_neither_cache_is_a_file_error_naming_it(cache):
    from glassbox.train.mmlu import load_mmlu

    with pytest.raises(FileNotFoundError, match="MMLU subject 'astronomy' split 'test' is neither in the local"):
        load_mmlu(["anatomy", "astronomy"])
    with pytest.raises(FileNotFoundError, match="subject 'anatomy' split 'dev'"):
        load_mmlu("anatomy", split="dev")


def test_a_row_without_four_choices_or_with_an_answer_out_of_range_is_named(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    from glassbox.train.mmlu import load_mmlu

    for bad in ({"question": "q", "choices": ["a", "b", "c"], "answer": 0},
                {"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4}):
        folder = tmp_path / f"hub{bad['answer']}"
        cache_mmlu(folder, {"anatomy": [FIXTURE["anatomy"][0], bad]})
        monkeypatch.setattr(hub, "HF_HUB_CACHE", str(folder))
        with pytest.raises(ValueError, match=r"MMLU 'anatomy' 'test' row 1: expected 4 choices and an answer in 0..3"):
            load_mmlu("anatomy")


def test_accuracy_is_the_hand_count_of_questions_whose_letter_scores_highest(cache):
    from glassbox import Config, HookedTransformer
    from glassbox.interp.multiple_choice import multiple_choice_accuracy
    from glassbox.models import gpt2_tokenizer
    from glassbox.train.mmlu import load_mmlu

    tok = gpt2_tokenizer()
    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=24, n_layers=2, n_heads=3, d_vocab=50257, n_ctx=128, d_mlp=44,
                                     init_range=0.2)).eval()
    rows = load_mmlu(["abstract_algebra", "anatomy"])
    letters = [tok.encode(" " + c)[0] for c in "ABCD"]
    assert all(len(tok.encode(" " + c)) == 1 for c in "ABCD")
    correct = {"abstract_algebra": 0, "anatomy": 0}
    for row in rows:  # the prompt written out by hand, one forward each
        text = f"Question: {row['question']}\nChoices:\n" + "".join(
            f"{l}. {c}\n" for l, c in zip("ABCD", row["choices"])) + "Answer:"
        with torch.no_grad():
            last = model(torch.tensor([tok.encode(text)]))[0, -1]
        correct[row["subject"]] += int(int(last[letters].argmax()) == row["answer"])
    got = multiple_choice_accuracy(model, rows, tok)
    assert got["num_total"] == 10 and got["num_correct"] == sum(correct.values())
    assert got["subject_scores"] == {"abstract_algebra": correct["abstract_algebra"] / 6, "anatomy": correct["anatomy"] / 4}
    assert got["accuracy"] == sum(correct.values()) / 10
    with pytest.raises(ValueError, match="no questions"):
        multiple_choice_accuracy(model, [], tok)
