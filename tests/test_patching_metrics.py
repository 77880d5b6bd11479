"""Patching metrics against hand computations on small random logits."""

import pytest
import torch
import torch.nn.functional as F

from glassbox.interp.patching import LogitDiff, Normalized, PositionMetric, TargetLoss, TargetProb


@pytest.fixture
def logits():
    return torch.randn(6, 5, 7, generator=torch.Generator().manual_seed(0))  # rows, pos, vocab


def test_logit_diff_tiles_per_prompt_answers_over_variant_rows(logits):
    # 6 rows = 2 variants x 3 prompts: row r belongs to prompt r % 3.
    metric = LogitDiff(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))
    expected = torch.stack([logits[r, -1, [1, 2, 3][r % 3]] - logits[r, -1, [4, 5, 6][r % 3]] for r in range(6)])
    torch.testing.assert_close(metric(logits), expected, atol=0, rtol=0)
    torch.testing.assert_close(metric.read(logits[:, -1]), expected, atol=0, rtol=0)


def test_positions_per_prompt_and_negative(logits):
    metric = LogitDiff(0, 1, pos=torch.tensor([0, 2, -2]))
    expected = torch.stack([logits[r, [0, 2, 3][r % 3], 0] - logits[r, [0, 2, 3][r % 3], 1] for r in range(6)])
    torch.testing.assert_close(metric(logits), expected, atol=0, rtol=0)
    assert metric.positions(6, 5, "cpu").tolist() == [0, 2, 3, 0, 2, 3]


def test_probability_and_loss_by_hand(logits):
    target = torch.tensor([3, 0])
    probs = torch.stack([F.softmax(logits[r, 2], -1)[[3, 0][r % 2]] for r in range(6)])
    # measured 1.5e-8 (values up to 0.23), bound 1e-7: 7x
    torch.testing.assert_close(TargetProb(target, pos=2)(logits), probs, atol=1e-7, rtol=0)
    loss = F.cross_entropy(logits[:, 2], target.repeat(3), reduction="none")
    # measured 0 (values up to 4), bound 1e-6 (exact here)
    torch.testing.assert_close(TargetLoss(target, pos=2)(logits), loss, atol=1e-6, rtol=0)


def test_normalised_is_one_on_clean_zero_on_corrupted(logits):
    clean, corrupted = logits[:3], logits[3:] * 0.5
    base = LogitDiff(torch.tensor([1, 2, 3]), 0)
    for per_prompt in (False, True):
        norm = Normalized.from_logits(base, clean, corrupted, per_prompt=per_prompt)
        # measured 0 (values up to 1), bound 1e-6 (exact here)
        torch.testing.assert_close(norm(clean).mean(), torch.tensor(1.0), atol=1e-6, rtol=0)
        # measured 0 (values up to 0), bound 1e-6 (exact here)
        torch.testing.assert_close(norm(corrupted).mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    norm = Normalized(base, clean=2.0, corrupted=-1.0)
    # measured 0 (values up to 0.83), bound 1e-6 (exact here)
    torch.testing.assert_close(norm(logits), (base(logits) + 1.0) / 3.0, atol=1e-6, rtol=0)


def test_generic_position_metric(logits):
    metric = PositionMetric(lambda read: read[:, 4] * 2, pos=1, name="twice logit 4")
    torch.testing.assert_close(metric(logits), logits[:, 1, 4] * 2, atol=0, rtol=0)
    assert metric.name == "twice logit 4"


@pytest.mark.parametrize("make, message", [
    (lambda: LogitDiff(torch.tensor(0.5), 1), "correct must be a token id"),
    (lambda: LogitDiff(torch.tensor([[1]]), 1), "correct must be a token id"),
    (lambda: Normalized(LogitDiff(0, 1), 1.0, 1.0), "equals corrupted"),
    (lambda: Normalized(lambda x: x, 1.0, 0.0), "metric"),  # typeguard or our check, both name it
])
def test_bad_metric_arguments_are_named(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_out_of_range_position_and_answers_that_do_not_tile(logits):
    with pytest.raises(ValueError, match="outside a sequence of 5"):
        LogitDiff(0, 1, pos=5)(logits)
    with pytest.raises(ValueError, match="one per prompt"):
        LogitDiff(torch.tensor([1, 2, 3, 4]), 0)(logits)  # 4 answers cannot tile 6 rows


@pytest.mark.parametrize("make, message", [
    (lambda: LogitDiff(-1, 2), "correct token id -1 is negative"),
    (lambda: LogitDiff(1, torch.tensor([2, -3])), "wrong token id -3 is negative"),
    (lambda: TargetProb(-2), "target token id -2 is negative"),
])
def test_negative_token_ids_are_refused_when_made(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("metric, message", [
    (LogitDiff(7, 1), r"correct token id 7 is outside \[0, d_vocab=7\)"),
    (LogitDiff(torch.tensor([1, 2, 9]), 0), r"correct token id 9 is outside \[0, d_vocab=7\)"),
    (TargetLoss(8), r"target token id 8 is outside \[0, d_vocab=7\)"),
    (Normalized(TargetProb(7), 1.0, 0.0), r"normalised probability: target token id 7 is outside"),
])
def test_token_ids_beyond_the_vocabulary_are_named(logits, metric, message):
    # Before, these failed inside torch.gather ("index 7 is out of bounds for dimension 1 with size 7").
    with pytest.raises(ValueError, match=message):
        metric(logits)
