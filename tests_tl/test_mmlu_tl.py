"""MMLU (``make_mmlu_data_loader``, ``mmlu_eval``) against TransformerLens 3.9: its subject list, its
rows' format, and its score of the same questions on a model with the same weights."""

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import transformer_lens
import transformer_lens.evals as tl_evals

import glassbox.tl as gtl
from tl_oracle import tiny_gpt2, tl_twin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_cache import cache_mmlu  # noqa: E402

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "tests" / "data" / "mmlu_tiny.json").read_text())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    cache_mmlu(tmp_path / "hub", FIXTURE)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))


def test_subjects_and_answer_letters_are_transformer_lens_s():
    assert list(gtl.evals.MMLU_SUBJECTS) == list(tl_evals.MMLU_SUBJECTS)
    assert list(gtl.evals.MMLU_ANSWER_LETTERS) == list(tl_evals.MMLU_ANSWER_LETTERS)


def test_an_invalid_subject_is_a_value_error_in_both():
    for loader in (tl_evals.make_mmlu_data_loader, gtl.evals.make_mmlu_data_loader):
        with pytest.raises(ValueError, match="Invalid subject"):
            loader(subjects="invalid_subject_name")


def test_rows_have_transformer_lens_s_keys_and_counts(cache):
    rows = gtl.evals.make_mmlu_data_loader(subjects=["abstract_algebra", "anatomy"], num_samples=3)
    assert len(rows) == 6 and all(set(r) == {"question", "choices", "answer", "subject"} for r in rows)
    assert rows[0] == dict(FIXTURE["abstract_algebra"][0], subject="abstract_algebra")


@pytest.mark.parametrize("seed,own_tokenizer", [(0, False), (1, False), (2, False), (0, True), (1, True)])
def test_mmlu_eval_scores_the_questions_as_transformer_lens_does(cache, seed, own_tokenizer):
    base = tiny_gpt2(seed=seed, n_ctx=128)
    ours = gtl.HookedTransformer.from_glassbox(base, fold_ln=False, center_writing_weights=False,
                                               center_unembed=False, fold_value_biases=False)
    twin = tl_twin(base)
    subjects = ["abstract_algebra", "anatomy"]
    rows = gtl.evals.make_mmlu_data_loader(subjects=subjects)
    given = dict(tokenizer=base.tokenizer) if own_tokenizer else {}  # used as it is: no BOS for GPT-2's
    with mock.patch.object(tl_evals, "make_mmlu_data_loader", return_value=rows):
        theirs = tl_evals.mmlu_eval(twin, subjects=subjects, **given)
    got = gtl.evals.mmlu_eval(ours, subjects=subjects, **given)
    assert got == theirs
    assert got["num_total"] == 10
