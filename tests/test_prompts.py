"""prompt_report and tl.utils.test_prompt against the model's own logits, read by hand."""

import contextlib
import io
import re

import pytest
import torch

from glassbox import HookedTransformer
from glassbox.interp.prompts import format_prompt_report, prompt_report
from glassbox.tl import utils

PROMPT = "Elizabeth read the letter, and Elizabeth read the"


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


def rank_by_counting(probs: torch.Tensor, token: int) -> int:
    """How many tokens have a strictly higher probability (no ties occur in these float32 logits)."""
    return int((probs > probs[token]).sum())


def test_one_token_answer(model):
    report = prompt_report(model, PROMPT, "letter", top_k=5)
    tokens = model.to_tokens(PROMPT + " letter")  # the answer is one token here, as the report shows
    assert report.answer_str_tokens == [[" letter"]]
    assert report.prompt_str_tokens == model.to_str_tokens(PROMPT)
    with torch.no_grad():
        logits = model(tokens)[0, -2]
    probs = logits.softmax(-1)
    answer = model.to_single_token(" letter")
    (score,), = report.answers
    assert (score.token, score.token_id) == (" letter", answer)
    assert score.rank == rank_by_counting(probs, answer)
    assert score.logit == float(logits[answer]) and score.prob == float(probs[answer])  # the same forward pass
    top = torch.topk(probs, 5)
    assert [t.token_id for t in report.top[0]] == top.indices.tolist()
    assert [t.rank for t in report.top[0]] == list(range(5))
    assert [t.prob for t in report.top[0]] == top.values.tolist()
    assert report.ranks == [[(" letter", score.rank)]]


def test_several_token_answer_scores_each_token_in_context(model):
    report = prompt_report(model, PROMPT, " letter, and", top_k=2)
    answer_ids = model.to_tokens(" letter, and", prepend_bos=False)[0]
    tokens = torch.cat([model.to_tokens(PROMPT)[0], answer_ids])[None]
    with torch.no_grad():
        logits = model(tokens)[0]
    n_prompt = model.to_tokens(PROMPT).shape[1]
    assert len(report.answers) == len(answer_ids) == 3
    for k, (score,) in enumerate(report.answers):
        probs = logits[n_prompt + k - 1].softmax(-1)
        assert score.token_id == int(answer_ids[k])
        assert score.rank == rank_by_counting(probs, score.token_id)
        assert score.prob == float(probs[score.token_id])  # the same forward pass


def test_several_answers_compare_first_tokens(model):
    report = prompt_report(model, PROMPT, ["letter", " garden", "whole letter"], top_k=1)
    with torch.no_grad():
        probs = model(model.to_tokens(PROMPT))[0, -1].softmax(-1)
    assert len(report.answers) == 1 and len(report.answers[0]) == 3
    for score, text in zip(report.answers[0], [" letter", " garden", " whole"]):
        assert score.token == text and score.rank == rank_by_counting(probs, score.token_id)


def test_printed_report(model):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert utils.test_prompt(PROMPT, "letter", model, top_k=3) is None
    lines = out.getvalue().splitlines()
    report = prompt_report(model, PROMPT, "letter", top_k=3)
    score = report.answers[0][0]
    assert lines[0] == f"Tokenized prompt: {model.to_str_tokens(PROMPT)}"
    assert lines[1] == "Tokenized answer: [' letter']"
    assert lines[2] == "Performance on answer token:"
    assert lines[3] == f"Rank: {score.rank:<8} Logit: {score.logit:5.2f} Prob: {score.prob:6.2%} Token: | letter|"
    assert re.fullmatch(r"Rank: \d +Logit: +[-\d.]+ Prob: +[\d.]+% Token: \| letter\|", lines[3])
    # the second-ranked token here is "\n", which breaks its line, so the top-k lines are read from the text
    tops = re.findall(r"Top (\d)th token\. Logit: +([-\d.]+) Prob: +([\d.]+)% Token: \|", out.getvalue())
    assert [(int(i), float(lg), float(p)) for i, lg, p in tops] == \
        [(t.rank, round(t.logit, 2), round(100 * t.prob, 2)) for t in report.top[0]]
    assert lines[-1] == f"Ranks of the answer tokens: [(' letter', {score.rank})]"
    quiet = format_prompt_report(report, print_details=False)
    assert quiet == lines[-1]


@pytest.mark.parametrize("answer,top_k,match", [("", 10, "answer"), ([], 10, "answer"), ("x", -1, "top_k")])
def test_bad_arguments(model, answer, top_k, match):
    with pytest.raises(ValueError, match=match):
        prompt_report(model, PROMPT, answer, top_k=top_k)
