"""Whole-pattern match scores ("mul", "abs") on hand-built patterns with hand-computed values, and
detect_head_matching on a model against a per-head computation from its cached patterns.

The crafted prompt has 5 positions and the previous-token detection pattern D[q, q-1] = 1. Head 0
is a perfect previous-token head (query 0 can only attend to itself), head 1 attends uniformly to
the causal prefix, head 2 puts everything on position 0.
"""

import pytest
import torch
from torch.testing import assert_close

from glassbox.interp.heads import detect_head, detect_head_matching, detection_pattern, match_scores
from glassbox.models import Config, HookedTransformer

F64 = torch.float64
POS = 5


@pytest.fixture(scope="module")
def crafted():
    q = torch.arange(POS)
    perfect = torch.zeros(POS, POS, dtype=F64)
    perfect[0, 0] = 1
    perfect[q[1:], q[1:] - 1] = 1
    uniform = torch.tril(torch.ones(POS, POS, dtype=F64)) / (q + 1)[:, None]
    bos = torch.zeros(POS, POS, dtype=F64)
    bos[:, 0] = 1
    D = torch.zeros(POS, POS, dtype=F64)
    D[q[1:], q[1:] - 1] = 1
    return torch.stack([perfect, uniform, bos])[None], D  # [layer=1 head=3 q k], [q k]


# sum(A * D) / sum(A): perfect 4/5; uniform (1/2 + 1/3 + 1/4 + 1/5) / 5 = 77/300; bos 1/5.
# exclude_bos (column 0 zeroed): perfect 3/3; uniform (77/60 - 1/2) / (5 - 137/60) = 47/163; bos 0/0.
# exclude_current_token (diagonal zeroed): perfect 4/4; uniform (77/60) / (5 - 137/60) = 77/163; bos 1/4
# (bos keeps its 5 weights on column 0 but loses the diagonal entry at query 0).
MUL = {(False, False): [4 / 5, 77 / 300, 1 / 5], (True, False): [1.0, 47 / 163, float("nan")],
       (False, True): [1.0, 77 / 163, 1 / 4]}
# 1 - sum |A - D| / 5, the distance summed per row: perfect 1 (row 0 only); uniform 1 + sum_q 2q/(q+1)
# = 193/30 (row q >= 1 misses D by q/(q+1) and spreads 1 - 1/(q+1) elsewhere); bos 1 + 0 + 3 * 2 = 7.
ABS = {(False, False): [1 - 1 / 5, 1 - 193 / 150, 1 - 7 / 5]}


@pytest.mark.parametrize("flags", list(MUL), ids=lambda f: f"bos={f[0]}-current={f[1]}")
def test_mul_score_is_the_share_of_all_attention_on_marked_entries(crafted, flags):
    patterns, D = crafted
    got = match_scores(patterns, D, "mul", exclude_bos=flags[0], exclude_current_token=flags[1])
    assert got.shape == (1, 3)
    # measured 5.6e-17 (scores up to 1), bound 1e-15: 18x
    assert_close(got[0], torch.tensor(MUL[flags], dtype=F64), atol=1e-15, rtol=0, equal_nan=True)


def test_abs_score_is_one_minus_the_summed_distance_over_pos(crafted):
    patterns, D = crafted
    got = match_scores(patterns, D, "abs")
    # measured 2.2e-16 (scores up to 0.8), bound 3e-15: 14x
    assert_close(got[0], torch.tensor(ABS[(False, False)], dtype=F64), atol=3e-15, rtol=0)
    excluded = match_scores(patterns, D, "abs", exclude_bos=True)
    # column 0 removed: perfect 0 -> 1; bos keeps rows 2-4's missed D entries, 3/5 -> 0.4; uniform loses
    # column 0's 1 + 1/2 + 1/3 + 1/4 + 1/5 = 137/60 of its 193/30, leaving 249/60
    expected = torch.tensor([1.0, 1 - 249 / 300, 1 - 3 / 5], dtype=F64)
    # measured 1.1e-16, bound 3e-15: 27x
    assert_close(excluded[0], expected, atol=3e-15, rtol=0)
    current = match_scores(patterns, D, "abs", exclude_current_token=True)
    # the diagonal removed: perfect loses its only miss (row 0) -> 1; bos loses row 0's miss -> 1 - 6/5
    # (measured 0, bound as above)
    assert_close(current[0, [0, 2]], torch.tensor([1.0, 1 - 6 / 5], dtype=F64), atol=3e-15, rtol=0)


def test_abs_rounding_to_decimals_rounds_the_distance_then_subtracts(crafted):
    patterns, D = crafted
    got = match_scores(patterns, D, "abs", decimals=3)
    # 193/150 = 1.28666... rounds to 1.287; 7/5 and 1/5 are already round
    assert got[0].tolist() == [1 - round(1 / 5, 3), 1 - round(193 / 150, 3), 1 - round(7 / 5, 3)]


def test_inputs_are_not_written_and_non_causal_patterns_are_refused_by_abs(crafted):
    patterns, D = crafted
    before = patterns.clone()
    match_scores(patterns, D, "mul", exclude_bos=True, exclude_current_token=True)
    match_scores(patterns, D, "abs", exclude_bos=True, exclude_current_token=True)
    assert torch.equal(patterns, before)
    with pytest.raises(ValueError, match="above the diagonal"):
        match_scores(patterns, D.T, "abs")
    with pytest.raises(ValueError, match="error_measure must be one of"):
        match_scores(patterns, D, "l2")
    # refused by glassbox, or first by the shape checker under the test suite
    with pytest.raises((ValueError, TypeError), match="square and of one size|detection"):
        match_scores(patterns, D[:4, :4])


# -- on a model ---------------------------------------------------------------------------------
CFG = Config(d_model=19, n_layers=2, n_heads=3, d_head=7, d_mlp=23, d_vocab=29, n_ctx=13, init_range=0.3)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG).eval()


@pytest.fixture(scope="module")
def prompt():
    segment = torch.randperm(CFG.d_vocab, generator=torch.Generator().manual_seed(3))[:5]
    return torch.cat([segment, segment])  # repeated, so duplicate and induction patterns mark entries


def per_head_reference(model, tokens, D, measure):
    """Each head's score from its cached pattern, one head at a time, by the formula."""
    _, cache = model.run_with_cache(tokens[None])
    out = torch.empty(CFG.n_layers, CFG.n_heads)
    for layer in range(CFG.n_layers):
        for head in range(CFG.n_heads):
            A = cache["pattern", layer][0, head]
            if measure == "mul":
                out[layer, head] = (A * D).sum() / A.sum()
            else:
                out[layer, head] = 1 - (A - D).abs().sum() / A.shape[0]
    return out


@pytest.mark.parametrize("kind", ["previous_token", "duplicate_token", "induction"])
@pytest.mark.parametrize("measure", ["mul", "abs"])
def test_model_scores_equal_the_per_head_formula_on_cached_patterns(model, prompt, kind, measure):
    D = detection_pattern(kind, prompt[None])[0]
    with torch.no_grad():
        got = detect_head_matching(model, prompt, kind, error_measure=measure)
        expected = per_head_reference(model, prompt, D, measure)
    assert got.shape == (CFG.n_layers, CFG.n_heads)
    # measured 2.4e-7 (float32, scores in [-1.6, 1]; the reference's full cache and the pattern-only run
    # differ by 2.7e-7 in the patterns), bound 3e-6: 12x
    assert_close(got, expected, atol=3e-6, rtol=0)


def test_heads_as_list_or_dict_score_only_those_and_minus_one_elsewhere(model, prompt):
    full = detect_head_matching(model, prompt, "previous_token")
    as_list = detect_head_matching(model, prompt, "previous_token", heads=[(0, 2), (1, 0), (1, 1)])
    as_dict = detect_head_matching(model, prompt, "previous_token", heads={1: [0, 1], 0: [2]})
    chosen = torch.zeros(CFG.n_layers, CFG.n_heads, dtype=torch.bool)
    chosen[0, 2] = chosen[1, 0] = chosen[1, 1] = True
    for got in (as_list, as_dict):
        assert torch.equal(got[chosen], full[chosen])
        assert bool((got[~chosen] == -1).all())


def test_a_list_of_prompts_scores_the_mean_of_each_prompts_score(model, prompt):
    prompts = [prompt, prompt[:7], torch.flip(prompt, [0])]  # different lengths
    got = detect_head_matching(model, prompts, "induction", error_measure="abs")
    each = torch.stack([detect_head_matching(model, p, "induction", error_measure="abs") for p in prompts])
    # the same per-prompt scores averaged: measured 0, bound 1e-7 for the mean's reduction order
    assert_close(got, each.mean(0), atol=1e-7, rtol=0)


def test_a_given_cache_gives_the_same_scores(model, prompt):
    D = torch.tril(torch.rand(10, 10, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    fresh = detect_head_matching(model, prompt, D, error_measure="abs", exclude_bos=True)
    for remove_batch_dim in (False, True):
        _, cache = model.run_with_cache(prompt[None], remove_batch_dim=remove_batch_dim)
        # measured 4.8e-7 (scores down to -1.7: a full cache's patterns differ from a pattern-only run's
        # by 2.7e-7), bound 5e-6: 10x
        assert_close(detect_head_matching(model, prompt, D, cache=cache, error_measure="abs", exclude_bos=True),
                     fresh, atol=5e-6, rtol=0)


def test_bad_arguments_are_named(model, prompt):
    _, cache = model.run_with_cache(prompt[None])
    D = detection_pattern("previous_token", prompt[None])[0]
    cases = [
        (dict(seq=[prompt, prompt], pattern="induction", cache=cache), "one cache holds one prompt"),
        (dict(seq=[prompt], pattern=D), "fits one prompt's length"),
        (dict(seq=prompt, pattern=D[:9, :9]), "lower triangular \\[pos pos\\] = \\[10 10\\]"),
        (dict(seq=prompt, pattern=D.T), "lower triangular"),
        (dict(seq=prompt, pattern="induction_head"), "unknown head kind"),
        (dict(seq=prompt, pattern=D, error_measure="max"), "error_measure must be one of"),
        (dict(seq=prompt, pattern=D, heads=[(2, 0)]), "outside 2 layers x 3 heads"),
        (dict(seq=prompt, pattern=D, heads=[(0, 1, 2)]), "not a \\(layer, head\\) pair"),
        (dict(seq=prompt[:1], pattern=D[:1, :1]), "needs 2 to n_ctx"),
        (dict(seq=prompt[:9], pattern=D[:9, :9], cache=cache), "this prompt needs \\[head 9 9\\]"),
        (dict(seq=[], pattern="induction"), "empty list"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            detect_head_matching(model, **kwargs)
    with pytest.warns(UserWarning, match="other than 0 and 1"):
        detect_head_matching(model, prompt, D * 0.5)


def test_glassbox_detect_head_keeps_its_own_per_query_score(model, prompt):
    """The per-query score differs from the whole-pattern one: the first query (nothing marked)
    counts in mul's total but not in glassbox's mean."""
    ours = detect_head(model, prompt[None], "previous_token")
    matching = detect_head_matching(model, prompt, "previous_token")
    _, cache = model.run_with_cache(prompt[None])
    A = cache["pattern", 1][0, 0]
    D = detection_pattern("previous_token", prompt[None])[0]
    per_query = (A * D).sum(-1)[1:].mean()  # queries 1.. each have one marked key
    # measured 3.0e-8, bound 1e-6: 33x
    assert_close(ours[1, 0], per_query, atol=1e-6, rtol=0)
    assert abs(float(ours[1, 0] - matching[1, 0])) > 1e-3
