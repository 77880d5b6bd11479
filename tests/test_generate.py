"""generate: greedy decoding against transformers' generate on the same weights, the key-value cache
against full recomputation, per-step hooks, EOS handling and sampling."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from glassbox import HookedTransformer
from glassbox.models.generate import get_last_token_logits, sample_next

PAD = 52
LENGTHS = (5, 9, 3)
WIDTH = max(LENGTHS)
NEW = 20


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(0)
    # A wide init spreads the logits, so greedy choices are far from ties and the text varies.
    config = GPT2Config(n_embd=30, n_layer=2, n_head=3, vocab_size=53, n_positions=37, bos_token_id=PAD,
                        eos_token_id=PAD, pad_token_id=PAD, initializer_range=0.5, attn_implementation="eager")
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def model(hf):
    return HookedTransformer.from_hf(hf)


@pytest.fixture(scope="module")
def prompts():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, PAD, (n,), generator=gen) for n in LENGTHS]


def padded(prompts, side: str):
    tokens = torch.full((len(prompts), WIDTH), PAD)
    mask = torch.zeros(len(prompts), WIDTH, dtype=torch.bool)
    for i, p in enumerate(prompts):
        span = slice(WIDTH - len(p), WIDTH) if side == "left" else slice(0, len(p))
        tokens[i, span], mask[i, span] = p, True
    return tokens, mask


def test_greedy_matches_transformers_with_and_without_cache(hf, model, prompts):
    tokens, mask = padded(prompts, "left")
    with torch.no_grad():
        ref = hf.generate(tokens, attention_mask=mask.long(), max_new_tokens=NEW, do_sample=False,
                          pad_token_id=PAD, eos_token_id=None)[:, WIDTH:]
    cached = model.generate(tokens, NEW, attention_mask=mask)
    recomputed = model.generate(tokens, NEW, attention_mask=mask, use_past_kv_cache=False)
    assert cached.shape == (3, WIDTH + NEW) and torch.equal(cached[:, :WIDTH], tokens)
    assert torch.equal(cached[:, WIDTH:], ref)
    assert torch.equal(recomputed, cached)
    assert len(set(ref.flatten().tolist())) > 8  # varied text, not one repeated token
    for i, p in enumerate(prompts):  # each prompt alone, no padding, agrees too
        alone = model.generate(p[None], NEW)
        with torch.no_grad():
            hf_alone = hf.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                   max_new_tokens=NEW, do_sample=False, pad_token_id=PAD, eos_token_id=None)
        assert torch.equal(alone[0, len(p):], ref[i]) and torch.equal(hf_alone[0, len(p):], ref[i])


def test_right_padding_generates_the_same(model, prompts):
    left = model.generate(*padded(prompts, "left")[:1], NEW, attention_mask=padded(prompts, "left")[1])
    tokens, mask = padded(prompts, "right")
    right = model.generate(tokens, NEW, attention_mask=mask)
    assert torch.equal(right[:, WIDTH:], left[:, WIDTH:])


def test_cached_logits_equal_full_recomputation(model, prompts):
    tokens, mask = padded(prompts, "left")
    out, logits = model.generate(tokens, NEW, attention_mask=mask, output_logits=True)
    _, no_cache = model.generate(tokens, NEW, attention_mask=mask, use_past_kv_cache=False, output_logits=True)
    assert logits.shape == (3, NEW, 53)
    full_mask = torch.cat([mask, torch.ones(3, NEW, dtype=torch.bool)], 1)
    with torch.no_grad():  # one forward over the finished text: logits before each new token
        full = model(out, attention_mask=full_mask)[:, WIDTH - 1: WIDTH - 1 + NEW]
    # Logits reach 10.3 here (initializer_range 0.5), so float32 rounding of differently shaped
    # matmuls reaches several ulps: measured 1.17e-5 with the cache (AMD EPYC; the earlier bound of
    # 1e-5 failed there) and 5.0e-6 without. Bound 1e-4: 8.5x; a wrong cached position or mask
    # moves logits by far more (the greedy test above sees different tokens).
    # measured 1.2e-5 (values up to 10), bound 0.0001: 9x
    torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)
    # measured 8.3e-6 (values up to 10), bound 0.0001: 12x
    torch.testing.assert_close(no_cache, full, atol=1e-4, rtol=0)


def test_hooks_fire_every_step_and_know_it(model, prompts):
    tokens, mask = padded(prompts, "left")
    seen = []

    def record(pattern, hook):
        seen.append((hook.ctx["step"], pattern.shape[-2], pattern.shape[-1]))

    with model.hooks([("blocks.1.attn.hook_pattern", record)]):
        model.generate(tokens, 4, attention_mask=mask)
    assert seen == [(0, WIDTH, WIDTH), (1, 1, WIDTH + 1), (2, 1, WIDTH + 2), (3, 1, WIDTH + 3)]
    assert all("step" not in point.ctx for point in model.hook_dict.values()) and not model.has_hooks

    def steer(resid, hook):  # a hook that edits one step changes the text from that step on
        if hook.ctx["step"] == 2:
            return torch.zeros_like(resid)

    plain = model.generate(tokens, 5, attention_mask=mask)
    with model.hooks([("blocks.1.hook_resid_pre", steer)]):
        steered = model.generate(tokens, 5, attention_mask=mask)
    assert torch.equal(steered[:, : WIDTH + 2], plain[:, : WIDTH + 2])
    assert not torch.equal(steered[:, WIDTH + 2], plain[:, WIDTH + 2])


def test_a_raising_hook_leaves_no_step_behind(model, prompts):
    def boom(act, hook):
        if hook.ctx["step"] == 1:
            raise RuntimeError("stop at step 1")

    with model.hooks([("blocks.0.hook_resid_post", boom)]):
        with pytest.raises(RuntimeError, match="step 1"):
            model.generate(prompts[0][None], 3)
    assert all("step" not in point.ctx for point in model.hook_dict.values()) and not model.has_hooks


def test_eos_finishes_a_row_and_stops_when_all_are_done(model, prompts):
    tokens, mask = padded(prompts, "left")
    free = model.generate(tokens, NEW, attention_mask=mask, eos_token_id=None)
    eos = int(free[1, WIDTH + 2])  # row 1's third new token
    out = model.generate(tokens, NEW, attention_mask=mask, eos_token_id=eos)
    for row in range(3):
        new, ref = out[row, WIDTH:].tolist(), free[row, WIDTH:].tolist()
        first = ref.index(eos) if eos in ref[: len(new)] else len(new)
        assert new[: first + 1] == ref[: first + 1]
        assert all(t == eos for t in new[first:])
    one = model.generate(prompts[1][None], NEW, eos_token_id=eos)
    assert one.shape[1] == len(prompts[1]) + free[1, WIDTH:].tolist().index(eos) + 1


def test_a_list_of_stop_ids_finishes_a_row_at_any_of_them(model, prompts):
    tokens, mask = padded(prompts, "left")
    free = model.generate(tokens, NEW, attention_mask=mask, eos_token_id=None)
    stops = [int(free[0, WIDTH + 2]), int(free[2, WIDTH + 4])]
    out = model.generate(tokens, NEW, attention_mask=mask, eos_token_id=stops)
    for row in range(3):
        new, ref = out[row, WIDTH:].tolist(), free[row, WIDTH:].tolist()
        hits = [i for i, t in enumerate(ref[: len(new)]) if t in stops]
        assert hits or row == 1  # rows 0 and 2 emit a stop id by construction
        first = hits[0] if hits else len(new)
        assert new[: first + 1] == ref[: first + 1]
        # this model has no tokenizer, so finished rows receive the list's first id
        assert all(t == stops[0] for t in new[first + 1:])
    with pytest.raises(ValueError, match="eos_token_id must be"):
        model.generate(tokens, 2, attention_mask=mask, eos_token_id=[])
    with pytest.raises(ValueError, match="eos_token_id 53 is outside"):
        model.generate(tokens, 2, attention_mask=mask, eos_token_id=[1, 53])


def test_sampling_is_seeded_and_filtered(model, prompts):
    p = prompts[0][None]
    a = model.generate(p, 8, do_sample=True, seed=3, eos_token_id=None)
    assert torch.equal(a, model.generate(p, 8, do_sample=True, seed=3, eos_token_id=None))
    assert not torch.equal(a, model.generate(p, 8, do_sample=True, seed=4, eos_token_id=None))
    greedy = model.generate(p, 8, eos_token_id=None)
    assert torch.equal(model.generate(p, 8, do_sample=True, top_k=1, seed=5, eos_token_id=None), greedy)
    assert torch.equal(model.generate(p, 8, do_sample=True, top_p=1e-6, seed=5, eos_token_id=None), greedy)


def test_sample_next_draws_from_the_filtered_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(40000, 4)
    gen = torch.Generator().manual_seed(0)

    def freq(**kw):
        draws = sample_next(logits, True, generator=gen, **kw)
        return torch.bincount(draws, minlength=4).float() / len(draws)

    # 40,000 seeded draws: a frequency's standard error is at most 0.0025, so 0.01 is 4 standard errors
    # (measured 4.4e-3 at worst, the same on every machine: the draws come from one seeded generator).
    torch.testing.assert_close(freq(), probs, atol=0.01, rtol=0)
    # measured 7.3e-4 (values up to 0.62), bound 0.01: 14x
    torch.testing.assert_close(freq(top_k=2), torch.tensor([0.625, 0.375, 0, 0]), atol=0.01, rtol=0)
    # top_p=0.7: token 2 is dropped since tokens 0 and 1 already hold 0.8 >= 0.7.
    # measured 4.2e-3 (values up to 0.62), bound 0.01: 2x
    torch.testing.assert_close(freq(top_p=0.7), torch.tensor([0.625, 0.375, 0, 0]), atol=0.01, rtol=0)
    hot = torch.tensor([0.5, 0.3, 0.15, 0.05]).pow(0.5)
    # measured 3.0e-3 (values up to 0.38), bound 0.01: 3x
    torch.testing.assert_close(freq(temperature=2.0), hot / hot.sum(), atol=0.01, rtol=0)


def test_last_token_logits_skip_pads():
    logits = torch.arange(2 * 4 * 3, dtype=torch.float).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(get_last_token_logits(logits, mask), torch.stack([logits[0, 1], logits[1, 3]]))
    torch.testing.assert_close(get_last_token_logits(logits), logits[:, -1])
    with pytest.raises(ValueError, match="no real token"):
        get_last_token_logits(logits, torch.zeros(2, 4, dtype=torch.bool))


@pytest.mark.parametrize("kwargs, words", [
    (dict(max_new_tokens=30), "n_ctx"), (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=2, temperature=0.0), "temperature"), (dict(max_new_tokens=2, top_p=1.5), "top_p"),
    (dict(max_new_tokens=2, top_k=0), "top_k"),
])
def test_bad_options_are_named(model, prompts, kwargs, words):
    with pytest.raises(ValueError, match=words):
        model.generate(prompts[1][None], **kwargs)
