"""Training data: windows, the shift-by-one targets, repeated spans, the held-out split and the
unigram baseline. The stream is ``arange`` so every token's origin is readable from its value."""

import math

import pytest
import torch

from glassbox.train import (RepeatSpec, add_repeats, sample_windows, split_text, training_batch,
                            unigram_loss)

N_CTX, BOS, VOCAB = 23, 997, 998
STREAM = torch.arange(900)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_windows_start_with_bos_and_targets_shift_by_one():
    inputs, targets = training_batch(STREAM, 7, N_CTX, BOS, VOCAB, RepeatSpec(), gen())
    assert inputs.shape == targets.shape == (7, N_CTX)
    assert (inputs[:, 0] == BOS).all()
    torch.testing.assert_close(targets[:, :-1], inputs[:, 1:], atol=0, rtol=0)
    body = torch.cat([inputs[:, 1:], targets[:, -1:]], dim=1)  # the n_ctx stream tokens
    assert (body.diff(dim=1) == 1).all(), "a window is not one contiguous slice of the stream"
    assert body.min() >= 0 and body.max() < len(STREAM)


def test_windows_cover_the_whole_stream_including_its_end():
    starts = sample_windows(STREAM[:40], 2000, N_CTX, BOS, gen())[:, 1]
    assert set(starts.tolist()) == set(range(40 - N_CTX + 1))


def test_same_generator_state_same_batch():
    a = training_batch(STREAM, 5, N_CTX, BOS, VOCAB, RepeatSpec(0.5), gen(3))
    b = training_batch(STREAM, 5, N_CTX, BOS, VOCAB, RepeatSpec(0.5), gen(3))
    c = training_batch(STREAM, 5, N_CTX, BOS, VOCAB, RepeatSpec(0.5), gen(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def copied_span(row):
    """(span, gap, start) of the one repeated span in an arange-derived window row."""
    values = row.tolist()
    seen, second = {}, []
    for pos, v in enumerate(values):
        if v in seen:
            second.append(pos)
        else:
            seen[v] = pos
    assert second, f"no repeat in {values}"
    assert second == list(range(second[0], second[-1] + 1)), f"second copy not contiguous: {second}"
    first = seen[values[second[0]]]
    span = len(second)
    assert values[first:first + span] == values[second[0]:second[-1] + 1]
    return span, second[0] - first - span, first


def test_corpus_repeats_copy_one_span_with_varied_period_and_offset():
    windows = sample_windows(STREAM, 300, N_CTX, BOS, gen(1))
    out = add_repeats(windows, RepeatSpec(1.0, random_repeat_frac=0.0, min_repeat=3), VOCAB, BOS, gen(2))
    spans, gaps, starts = set(), set(), set()
    for row in out:
        assert row[0] == BOS
        span, gap, start = copied_span(row)
        assert 3 <= span <= N_CTX // 2 and gap >= 0 and start >= 1
        spans.add(span), gaps.add(gap), starts.add(start)
    # every span length min_repeat..n_ctx//2 occurs, and the distance between copies varies
    assert spans == set(range(3, N_CTX // 2 + 1))
    assert len(gaps) >= 8 and len(starts) >= 8
    assert torch.equal(windows[:, 0], out[:, 0]) and not torch.equal(windows, out)


def test_random_repeats_are_random_tokens_never_bos():
    windows = sample_windows(STREAM, 200, N_CTX, BOS, gen(1))
    out = add_repeats(windows, RepeatSpec(1.0, random_repeat_frac=1.0, min_repeat=4), VOCAB, BOS, gen(2))
    assert (out[:, 1:] != BOS).all() and out.max() < VOCAB
    foreign = (out[:, 1:] >= len(STREAM)).sum().item()  # ids the arange stream never holds
    assert foreign > 200, "random spans should hold ids from the whole vocabulary"
    for row in out:
        values = row.tolist()
        # the random span occurs twice: some contiguous run of >= 4 tokens is repeated later
        assert any(values[i:i + 4] == values[j:j + 4] for i in range(1, len(values) - 4)
                   for j in range(i + 4, len(values) - 3)), values


def test_repeat_fraction_is_respected():
    windows = sample_windows(STREAM, 1000, N_CTX, BOS, gen(1))
    out = add_repeats(windows, RepeatSpec(0.25, random_repeat_frac=0.0), VOCAB, BOS, gen(2))
    changed = (out != windows).any(dim=1).float().mean().item()
    assert 0.20 <= changed <= 0.30
    assert torch.equal(add_repeats(windows, RepeatSpec(0.0), VOCAB, BOS, gen(2)), windows)


@pytest.mark.parametrize("kwargs", [dict(repeat_frac=1.5), dict(random_repeat_frac=-0.1), dict(min_repeat=0)])
def test_repeat_spec_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RepeatSpec(**kwargs)


def test_min_repeat_must_fit_twice():
    windows = sample_windows(STREAM, 2, N_CTX, BOS, gen())
    with pytest.raises(ValueError, match="min_repeat=12"):
        add_repeats(windows, RepeatSpec(1.0, min_repeat=12), VOCAB, BOS, gen())


def test_stream_shorter_than_context_is_an_error():
    with pytest.raises(ValueError, match="shorter than n_ctx=23"):
        sample_windows(STREAM[:10], 2, N_CTX, BOS, gen())


def test_split_text_cuts_a_suffix_at_a_line_break():
    text = "".join(f"line {i} of the text\n" for i in range(100))
    train, heldout = split_text(text, 0.1)
    assert train + heldout == text
    assert train.endswith("\n") and heldout.startswith("line ")
    assert 0.08 <= len(heldout) / len(text) <= 0.1
    with pytest.raises(ValueError, match="heldout_frac"):
        split_text(text, 1.0)
    with pytest.raises(ValueError, match="line break"):
        split_text("no line breaks at all", 0.5)


def test_unigram_loss_by_hand():
    # add-one counts over 3 tokens: [2+1, 1+1, 0+1] / 6
    expected = -(math.log(3 / 6) + math.log(1 / 6)) / 2
    got = unigram_loss(torch.tensor([0, 0, 1]), torch.tensor([0, 2]), 3)
    assert got == pytest.approx(expected, rel=1e-12, abs=0)  # float64: measured 1.8e-16 relative


def test_many_copies_repeat_one_span_at_a_constant_period():
    windows = sample_windows(STREAM, 300, N_CTX, BOS, gen(1))
    spec = RepeatSpec(1.0, random_repeat_frac=0.0, min_repeat=2, max_copies=5)
    out = add_repeats(windows, spec, VOCAB, BOS, gen(2))
    counts = set()
    for row in out.tolist():
        # each value of the copied span occurs `copies` times, always `period` apart
        positions = {}
        for pos, v in enumerate(row):
            positions.setdefault(v, []).append(pos)
        repeated = [p for p in positions.values() if len(p) > 1]
        assert repeated, row
        copies = {len(p) for p in repeated}
        periods = {b - a for p in repeated for a, b in zip(p, p[1:])}
        assert len(copies) == 1 and len(periods) == 1, row
        span, period = len(repeated), periods.pop()
        assert 2 <= span <= period and copies.pop() * span <= N_CTX
        counts.add(len(repeated[0]))
    assert counts == {2, 3, 4, 5}


def test_two_copy_recipes_take_no_extra_random_numbers():
    # With max_copies=2 a batch takes exactly: the window starts, 5 uniforms per row, the noise.
    g = gen(3)
    training_batch(STREAM, 9, N_CTX, BOS, VOCAB, RepeatSpec(0.5, 0.5, max_copies=2), g)
    by_hand = gen(3)
    torch.randint(0, 10, (9,), generator=by_hand)
    torch.rand(9, 5, generator=by_hand)
    torch.randint(0, 10, (9, N_CTX + 1), generator=by_hand)
    assert torch.equal(g.get_state(), by_hand.get_state())
    with pytest.raises(ValueError, match="max_copies"):
        RepeatSpec(max_copies=1)
