"""``PosEmbed.forward(tokens, past_kv_pos_offset, attention_mask)`` against TransformerLens 3.9's, on
the same W_pos: the same rows (bit-equal: both are look-ups), zero at pads, with and without a
cache's mask (built by each side's ``append_attention_mask``)."""

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as TheirCache

FIELDS = dict(d_model=10, d_head=5, n_layers=1, n_ctx=13, d_vocab=31, act_fn="gelu")


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**FIELDS))
    theirs = transformer_lens.HookedTransformer(transformer_lens.HookedTransformerConfig(**FIELDS))
    with torch.no_grad():
        theirs.pos_embed.W_pos.copy_(ours.pos_embed.W_pos)
    return ours, theirs


TOKENS = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12], [1, 2, 3, 4, 5]])
MASKS = {"none": None,
         "left": torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]),
         "right": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("offset", [0, 3])
def test_pos_embed_equals_transformer_lens_s(pair, mask, offset):
    ours, theirs = pair
    m = MASKS[mask]
    if m is not None and offset:
        m = torch.cat([torch.ones(3, offset, dtype=torch.long), m], 1)  # the cached positions' mask first
    with torch.no_grad():
        got = ours.pos_embed(TOKENS, offset, attention_mask=m)
        want = theirs.pos_embed(TOKENS, offset, attention_mask=m)
    assert torch.equal(got, want)


def test_pos_embed_with_each_side_s_cache_mask(pair):
    ours, theirs = pair
    first, second = MASKS["left"], torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    our_cache = gtl.past_key_value_caching.HookedTransformerKeyValueCache.init_cache(ours.cfg, "cpu", 3)
    their_cache = TheirCache.init_cache(theirs.cfg, "cpu", 3)
    masks = []
    for cache in (our_cache, their_cache):
        cache.append_attention_mask(first)
        masks.append(cache.append_attention_mask(second))
    with torch.no_grad():
        got = ours.pos_embed(TOKENS[:, :3], 5, attention_mask=masks[0])
        want = theirs.pos_embed(TOKENS[:, :3], 5, attention_mask=masks[1])
    assert torch.equal(got, want)
