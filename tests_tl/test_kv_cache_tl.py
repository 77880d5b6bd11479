"""The key-value cache's TransformerLens surface against TransformerLens 3.9, on the same weights.

A frozen cache (``freeze()``): multi-token continuations of one padded prefix, the cache kept as it
was; ``unfreeze()``; ``start_at_layer`` with a frozen cache; ``append_attention_mask``. Each makes the
same calls on glassbox (with glassbox.tl's cache class) and on its TransformerLens twin. Token ids
stay below 50000 so that TransformerLens, which takes any id equal to the pad token (50256) for a
pad when a cache is passed, sees no pads but the masked ones.
"""

import pytest
import torch

from glassbox.tl.past_key_value_caching import HookedTransformerKeyValueCache as OurCache
from tl_oracle import max_diff, tiny_model, tl_twin
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as TheirCache
from transformer_lens.utils import get_attention_mask as tl_get_attention_mask

# measured max |ours - theirs| over these tests: 2.0e-6 (values up to 4.9), bound 3e-5: 15x
BOUND = 3e-5


@pytest.fixture(scope="module", params=["learned", "rotary"])
def pair(request):
    model = tiny_model(0, n_layers=3, positional=request.param).eval()
    return model, tl_twin(model)


def ids(batch, pos, seed):
    return torch.randint(0, 50000, (batch, pos), generator=torch.Generator().manual_seed(seed))


def masks(side, batch, pos, short_row=1, short_by=2):
    if side is None:
        return None
    mask = torch.ones(batch, pos, dtype=torch.long)
    if side == "left":
        mask[short_row, :short_by] = 0
    else:
        mask[short_row, pos - short_by:] = 0
    return mask


@pytest.mark.parametrize("pre_side", ["left", "right", None])
@pytest.mark.parametrize("post_side", ["left", "right", None])
@torch.no_grad()
def test_frozen_cache_multi_token_batch(pair, pre_side, post_side):
    model, twin = pair
    prefix, cont = ids(2, 7, 0), ids(2, 5, 1)
    pre_mask, post_mask = masks(pre_side, 2, 7), masks(post_side, 2, 5, short_row=0, short_by=1)
    ours, theirs = OurCache.init_cache(model.cfg, "cpu", 2), TheirCache.init_cache(twin.cfg, "cpu", 2)
    model(prefix, attention_mask=pre_mask, past_kv_cache=ours)
    twin(prefix, attention_mask=pre_mask, past_kv_cache=theirs)
    ours.freeze()
    theirs.freeze()
    assert ours.frozen and all(e.frozen for e in ours.entries)
    for _ in range(2):  # the second run sees the same prefix: nothing was appended
        got = model(cont, attention_mask=post_mask, past_kv_cache=ours)
        want = twin(cont, attention_mask=post_mask, past_kv_cache=theirs)
        real = torch.ones(2, 5, dtype=torch.bool) if post_mask is None else post_mask.bool()
        assert max_diff(got[real], want[real]) < BOUND
    cached = torch.ones(2, 7, dtype=torch.bool) if pre_mask is None else pre_mask.bool()
    for a, b in zip(ours.entries, theirs.entries):  # at pads TransformerLens adds no position embedding
        assert a.past_keys.shape == b.past_keys.shape == (2, 7, 3, 8)
        if model.cfg.positional == "rotary":
            continue  # glassbox caches rotated keys, TransformerLens unrotated ones (rotating all each forward)
        assert max_diff(a.past_keys[cached], b.past_keys[cached]) < BOUND
        assert max_diff(a.past_values[cached], b.past_values[cached]) < BOUND


@torch.no_grad()
def test_freeze_then_unfreeze_grows_again(pair):
    model, twin = pair
    prefix, cont = ids(1, 6, 2), ids(1, 4, 3)
    ours, theirs = OurCache.init_cache(model.cfg, "cpu", 1), TheirCache.init_cache(twin.cfg, "cpu", 1)
    for m, c in ((model, ours), (twin, theirs)):
        m(prefix, past_kv_cache=c)
        c.freeze()
        m(cont, past_kv_cache=c)
        c.unfreeze()
        assert not c.frozen and not any(e.frozen for e in c.entries)
        m(cont, past_kv_cache=c)
    assert [e.past_keys.shape[1] for e in ours.entries] == [e.past_keys.shape[1] for e in theirs.entries] == [10] * 3
    assert max_diff(model(cont, past_kv_cache=ours), twin(cont, past_kv_cache=theirs)) < BOUND


@pytest.mark.parametrize("pre_side", ["left", None])
@torch.no_grad()
def test_start_at_layer_with_a_frozen_cache(pair, pre_side):
    model, twin = pair
    prefix, cont = ids(2, 6, 4), ids(2, 3, 5)
    pre_mask = masks(pre_side, 2, 6)
    ours, theirs = OurCache.init_cache(model.cfg, "cpu", 2), TheirCache.init_cache(twin.cfg, "cpu", 2)
    model(prefix, attention_mask=pre_mask, past_kv_cache=ours)
    twin(prefix, attention_mask=pre_mask, past_kv_cache=theirs)
    ours.freeze()
    theirs.freeze()
    got_embed = model.input_to_embed(cont, past_kv_cache=ours)
    want_embed = twin.input_to_embed(cont, past_kv_cache=theirs)
    assert torch.equal(got_embed[0], want_embed[0])  # the same two embedding rows added
    if pre_side is not None:
        assert torch.equal(got_embed[3], want_embed[3].bool())
    for layer in (1, 2):
        _, our_cache = model.run_with_cache(cont, stop_at_layer=layer, past_kv_cache=ours)
        _, their_cache = twin.run_with_cache(cont, stop_at_layer=layer, past_kv_cache=theirs)
        name = f"blocks.{layer - 1}.hook_resid_post"
        assert max_diff(our_cache[name], their_cache[name]) < BOUND
        got = model(our_cache[name], start_at_layer=layer, tokens=got_embed[1], attention_mask=got_embed[3],
                    past_kv_cache=ours)
        want = twin(their_cache[name], start_at_layer=layer, tokens=want_embed[1], attention_mask=want_embed[3],
                    past_kv_cache=theirs)
        assert max_diff(got, want) < BOUND
    assert all(e.past_keys.shape[1] == 6 for e in ours.entries)


def test_append_attention_mask(pair):
    model, twin = pair
    ours, theirs = OurCache.init_cache(model.cfg, "cpu", 2), TheirCache.init_cache(twin.cfg, "cpu", 2)
    first, second = torch.tensor([[0, 1, 1], [1, 1, 1]]), torch.tensor([[1, 1], [1, 0]])
    for c in (ours, theirs):
        c.append_attention_mask(first)
    got, want = ours.append_attention_mask(second), theirs.append_attention_mask(second)
    assert got.tolist() == want.bool().tolist()
    assert ours.previous_attention_mask.tolist() == theirs.previous_attention_mask.bool().tolist()
    ours.freeze()
    theirs.freeze()
    got, want = ours.append_attention_mask(second), theirs.append_attention_mask(second)
    assert got.tolist() == want.bool().tolist() and got.shape == (2, 7)
    assert ours.previous_attention_mask.shape == theirs.previous_attention_mask.shape == (2, 5)


PRE = ["It's always locked", "I'd rather be burned in Canada"]
POST = [" by the magistrate", " than to freeze here in the South"]


@pytest.fixture(scope="module")
def padded_pair():
    """The pair with a GPT-2 tokenizer each (pad = eos = BOS = 50256) and left padding by default."""
    import copy

    import glassbox.tl as gtl
    from glassbox.models import gpt2_tokenizer

    model = tiny_model(3, n_layers=2).eval()
    ours = gtl.HookedTransformer.from_glassbox(model, fold_ln=False, center_writing_weights=False,
                                               center_unembed=False, fold_value_biases=False,
                                               default_padding_side="left")
    twin = tl_twin(model, tokenizer=copy.deepcopy(gpt2_tokenizer()))
    twin.tokenizer.padding_side = "left"
    return ours, twin


@pytest.mark.parametrize("pre_side", ["left", "right"])
@pytest.mark.parametrize("post_side", ["left", "right"])
@torch.no_grad()
def test_padded_token_ids_with_a_cache_are_masked_as_transformer_lens_does(padded_pair, pre_side, post_side):
    """Token ids passed without an attention_mask, with a cache: TransformerLens takes the leading
    (left) or trailing (right) pad ids for padding (TransformerLens's 2.18 test_multi_token_batch).
    glassbox.tl attended to them as real tokens, moving the continuation's logits by ~1."""
    ours, twin = padded_pair
    pre, post = twin.to_tokens(PRE, padding_side=pre_side), twin.to_tokens(POST, prepend_bos=False,
                                                                           padding_side=post_side)
    assert (pre == 50256).sum() > 2 and (post == 50256).sum() > 0  # both are padded
    caches = OurCache.init_cache(ours.cfg, "cpu", 2), TheirCache.init_cache(twin.cfg, "cpu", 2)
    outs = []
    for m, cache in zip((ours, twin), caches):
        m(pre, past_kv_cache=cache, padding_side=pre_side)
        cache.freeze()
        outs.append(m(post, past_kv_cache=cache, padding_side=post_side, prepend_bos=False))
    real = post != 50256
    assert max_diff(outs[0][real], outs[1][real]) < BOUND  # measured <= 1.5e-6
    # and the first row's continuation is what the unpadded prompt gives, as the test asserts
    alone = twin.to_tokens(PRE[0] + POST[0])
    n = real[0].sum()
    row = outs[0][0, -n:] if post_side == "left" else outs[0][0, :n]
    assert max_diff(row, ours(alone)[0, -n:]) < BOUND  # measured <= 1.2e-6


@torch.no_grad()
def test_left_padded_token_ids_without_a_cache_are_masked_as_transformer_lens_does(padded_pair):
    ours, twin = padded_pair
    for bos in (True, False):
        tokens = twin.to_tokens(PRE, prepend_bos=bos)  # left padded
        want, got = twin(tokens, prepend_bos=bos), ours(tokens, prepend_bos=bos)
        real = tl_get_attention_mask(twin.tokenizer, tokens, bos).bool()  # a BOS equal to the pad stays real
        assert not real.all()
        assert max_diff(got[real], want[real]) < BOUND  # measured <= 1.8e-6
