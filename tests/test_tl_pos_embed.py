"""glassbox.tl's ``PosEmbed.forward(tokens, past_kv_pos_offset, attention_mask)`` and glassbox's
``PosEmbed.for_tokens`` under it.

Oracles: the rows of W_pos at hand-written positions (count of real tokens before each, offset by
the cache), zero at pads; and the model's own ``hook_pos_embed`` at real tokens, the same positions
computed by the forward. Then bad offsets and masks, each refused by name.
"""

import pytest
import torch

import glassbox.tl as tl
from glassbox.tl.past_key_value_caching import HookedTransformerKeyValueCache


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tl.HookedTransformer(tl.HookedTransformerConfig(d_model=10, d_head=5, n_layers=1, n_ctx=13, d_vocab=31,
                                                           act_fn="gelu")).eval()


TOKENS = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
LEFT = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
RIGHT = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])


def rows(model, positions, mask):
    """W_pos at hand-written positions, zero where the mask is 0."""
    out = model.pos_embed.W_pos[torch.tensor(positions)]
    return out * torch.as_tensor(mask)[..., None]


def test_the_model_s_learned_position_embedding_has_transformer_lens_s_forward(model):
    assert type(model.pos_embed) is tl.components.PosEmbed
    assert isinstance(model.pos_embed, tl.components.PosEmbed)
    assert list(dict(model.named_parameters())).count("pos_embed.W_pos") == 1
    got = model.pos_embed(TOKENS)  # no mask: W_pos[0:pos] for every row
    assert torch.equal(got, rows(model, [[0, 1, 2, 3, 4]] * 2, torch.ones(2, 5)))
    assert torch.equal(model.pos_embed(TOKENS, 4), rows(model, [[4, 5, 6, 7, 8]] * 2, torch.ones(2, 5)))


@pytest.mark.parametrize("mask, positions", [
    (LEFT, [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]),
    (RIGHT, [[0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]),
])
def test_positions_count_real_tokens_and_pads_are_zero(model, mask, positions):
    got = model.pos_embed(TOKENS, 0, attention_mask=mask)
    assert torch.equal(got, rows(model, positions, mask))
    assert torch.equal(model.pos_embed(TOKENS, 0, attention_mask=mask.bool()), got)
    # the model's forward adds the same rows at real tokens
    _, cache = model.run_with_cache(TOKENS, attention_mask=mask, names_filter="hook_pos_embed")
    real = mask.bool()
    assert torch.equal(cache["hook_pos_embed"][real], got[real])
    assert torch.equal(model.pos_embed.for_tokens(TOKENS, 0, mask)[real], got[real])


def test_with_a_cache_s_mask(model):
    kv = HookedTransformerKeyValueCache.init_cache(model.cfg, "cpu", 2)
    kv.append_attention_mask(LEFT)
    second = torch.tensor([[1, 1, 0], [1, 1, 1]])
    full = kv.append_attention_mask(second)
    got = model.pos_embed(TOKENS[:, :3], 5, attention_mask=full)
    assert torch.equal(got, rows(model, [[5, 6, 0], [3, 4, 5]], second))


@pytest.mark.parametrize("offset, mask, error, match", [
    (-1, None, ValueError, "past_kv_pos_offset must be an int >= 0, got -1"),
    (1.0, None, ValueError, "past_kv_pos_offset must be an int >= 0, got 1.0"),
    (True, None, ValueError, "past_kv_pos_offset must be an int >= 0, got True"),
    (9, None, ValueError, "past_kv_pos_offset=9 and 5 tokens exceed n_ctx=13"),
    (0, torch.ones(2, 4), ValueError, r"attention_mask has shape \(2, 4\)"),
    (2, LEFT, ValueError, r"attention_mask has shape \(2, 5\), past_kv_pos_offset=2 and tokens"),
    (0, torch.full((2, 5), 0.5), ValueError, "attention_mask holds 0.5"),
    (0, torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]), ValueError, "row 1 has no real token"),
])
def test_bad_offsets_and_masks_are_refused(model, offset, mask, error, match):
    with pytest.raises(error, match=match):
        model.pos_embed(TOKENS, offset, attention_mask=mask)


def test_float_token_ids_are_refused(model):
    with pytest.raises(ValueError, match="token ids"):
        model.pos_embed(TOKENS.float() + 0.5)
