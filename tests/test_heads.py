"""Head detection: a previous-token head built by hand is found first, detection patterns match
hand-written ones, and scores equal hand computations from the cached patterns."""

import math

import pytest
import torch

from glassbox import Config, HookedTransformer
from glassbox.interp import ActivationCache, detect_head, detection_pattern, induction_score

CFG = Config(d_model=23, n_layers=2, n_heads=3, d_head=13, d_mlp=37, d_vocab=29, n_ctx=13)
LAYER, HEAD = 1, 2


@pytest.fixture(scope="module")
def prev_token_model():
    """Layer 0 writes nothing and tokens embed to 0, so layer 1 reads W_pos[p] = 5 e_p. Head (1, 2)
    matches query p with key p - 1 through W_Q = I and W_K = shift; every other head stays random."""
    torch.manual_seed(0)
    model = HookedTransformer(CFG).eval()
    beta = 1.5
    with torch.no_grad():
        block0 = model.blocks[0]
        for param in (block0.attn.W_O, block0.attn.b_O, block0.mlp.W_out, block0.mlp.b_out, model.embed.W_E):
            param.zero_()
        model.pos_embed.W_pos.copy_(5 * torch.eye(CFG.n_ctx, CFG.d_model))
        attn = model.blocks[LAYER].attn
        attn.W_Q[HEAD].copy_(beta * torch.eye(CFG.d_model, CFG.d_head))
        attn.W_K[HEAD].copy_(beta * torch.eye(CFG.d_model, CFG.d_head, ).roll(1, dims=1) *
                             (torch.arange(CFG.d_model) < CFG.d_head - 1)[:, None])
    return model


def test_hand_built_previous_token_head_ranks_first(prev_token_model):
    tokens = torch.randint(0, CFG.d_vocab, (4, CFG.n_ctx), generator=torch.Generator().manual_seed(1))
    scores = detect_head(prev_token_model, tokens, "previous_token")
    assert scores.shape == (2, 3)
    assert divmod(int(scores.argmax()), 3) == (LAYER, HEAD)
    assert float(scores[LAYER, HEAD]) > 0.99
    assert float(scores.flatten().topk(2).values[1]) < 0.6
    # Hand computation from the cached pattern: mean attention from query q to key q - 1, q >= 1.
    _, cache = prev_token_model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    for layer in range(2):
        pattern = cache["pattern", layer]
        q = torch.arange(1, CFG.n_ctx)
        expected = pattern[:, :, q, q - 1].mean((0, 2))
        # measured 3.0e-8 (values up to 1), bound 1e-6: 34x
        torch.testing.assert_close(scores[layer], expected, atol=1e-6, rtol=0)
    # measured 0 (values up to 1), bound 1e-7 (exact here)
    torch.testing.assert_close(detect_head(prev_token_model, cache, "previous_token"), scores, atol=1e-7, rtol=0)


def test_detection_patterns_match_hand_written_ones():
    tokens = torch.tensor([[5, 7, 9, 5, 7, 9]])
    prev = torch.zeros(6, 6)
    prev[torch.arange(1, 6), torch.arange(0, 5)] = 1
    dup = torch.zeros(6, 6)
    dup[3, 0] = dup[4, 1] = dup[5, 2] = 1
    ind = torch.zeros(6, 6)
    ind[3, 1] = ind[4, 2] = ind[5, 3] = 1
    torch.testing.assert_close(detection_pattern("previous_token", tokens)[0], prev, atol=0, rtol=0)
    torch.testing.assert_close(detection_pattern("duplicate_token", tokens)[0], dup, atol=0, rtol=0)
    torch.testing.assert_close(detection_pattern("induction", tokens)[0], ind, atol=0, rtol=0)
    with pytest.raises(ValueError, match="head kind"):
        detection_pattern("successor", tokens)


def synthetic_cache(model, tokens, head0, attention_mask=None):
    """A cache whose layer-0 head 0 has the given pattern and head 1 attends uniformly."""
    pos = tokens.shape[1]
    uniform = torch.ones(pos, pos).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    pattern = torch.stack([head0, uniform])[None]
    return ActivationCache({"blocks.0.attn.hook_pattern": pattern}, model, tokens=tokens,
                           attention_mask=attention_mask)


@pytest.mark.parametrize("kind", ["duplicate_token", "induction"])
def test_scores_on_a_synthetic_cache(kind):
    model = HookedTransformer(Config(d_model=10, n_layers=1, n_heads=2, d_vocab=11, n_ctx=7))
    tokens = torch.tensor([[5, 7, 9, 5, 7, 9]])
    target = detection_pattern(kind, tokens)[0]
    perfect = target + torch.eye(6) * (target.sum(-1, keepdim=True) == 0)  # no target: attend to self
    scores = detect_head(model, synthetic_cache(model, tokens, perfect), kind)
    # Queries 3, 4, 5 have one target each; uniform attention puts 1/(q+1) on it.
    expected_uniform = (1 / 4 + 1 / 5 + 1 / 6) / 3
    # measured 0 (values up to 1), bound 1e-6 (exact here)
    torch.testing.assert_close(scores, torch.tensor([[1.0, expected_uniform]]), atol=1e-6, rtol=0)
    half = 0.5 * perfect + 0.5 * torch.eye(6)  # scores below: measured 0 and 2.0e-8 off; bound 1e-6
    assert math.isclose(float(detect_head(model, synthetic_cache(model, tokens, half), kind)[0, 0]), 0.5,
                        abs_tol=1e-6)
    custom = detect_head(model, synthetic_cache(model, tokens, perfect), target)
    torch.testing.assert_close(custom, scores, atol=0, rtol=0)


def test_padding_and_exclude_bos():
    model = HookedTransformer(Config(d_model=10, n_layers=1, n_heads=2, d_vocab=11, n_ctx=7))
    tokens = torch.tensor([[0, 0, 1, 2, 3, 4]])
    mask = torch.tensor([[False, False, True, True, True, True]])  # left padded: 4 real tokens
    head0 = torch.zeros(6, 6)
    head0[:, 2] = 0.5  # half of every query's attention on the first real token
    head0[torch.arange(3, 6), torch.arange(2, 5)] += 0.5  # the other half on the previous real token
    head0[:2, :2] = torch.eye(2)
    head0[2, 2] = 1.0
    cache = synthetic_cache(model, tokens, head0, mask)  # scores below: measured 2.0e-8 off; bound 1e-6
    assert math.isclose(float(detect_head(model, cache, "previous_token")[0, 0]), (1.0 + 0.5 + 0.5) / 3,
                        abs_tol=1e-6)
    # Without the first real token, queries 4 and 5 put everything on their previous token; query 3's
    # previous token is the first real token, so it has nothing left (its row is 0 after removal).
    assert math.isclose(float(detect_head(model, cache, "previous_token", exclude_bos=True)[0, 0]),
                        (0 + 1 + 1) / 3, abs_tol=1e-6)


def test_induction_score_equals_hand_computation():
    model = HookedTransformer(Config(d_model=12, n_layers=2, n_heads=3, d_vocab=31, n_ctx=19)).eval()
    seq_len = 6
    scores, tokens = induction_score(model, seq_len, n_repeats=3, batch=2, seed=4, bos_token_id=0,
                                     return_tokens=True)
    assert tokens.shape == (2, 19) and bool((tokens[:, 0] == 0).all()) and bool((tokens[:, 1:] != 0).all())
    assert torch.equal(tokens[:, 1:7], tokens[:, 7:13]) and torch.equal(tokens[:, 1:7], tokens[:, 13:])
    assert all(len(set(row[1:7].tolist())) == seq_len for row in tokens)
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        p = cache["pattern", layer]
        q2 = torch.arange(7, 13)  # second repeat: one target, one segment back plus one
        q3 = torch.arange(13, 19)  # third repeat: two targets
        second = p[:, :, q2, q2 - seq_len + 1]
        third = p[:, :, q3, q3 - seq_len + 1] + p[:, :, q3, q3 - 2 * seq_len + 1]
        expected = torch.cat([second, third], -1).mean((0, 2))
        # measured 3.0e-8 (values up to 1), bound 1e-6: 34x
        torch.testing.assert_close(scores[layer], expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="n_ctx"):
        induction_score(model, 10, n_repeats=2, bos_token_id=0)
