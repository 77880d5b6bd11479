"""TransformerLens's tokenizer conventions on glassbox.tl's model, against TransformerLens 3.9 with the same
weights: the model's tokenizer pads with eos (TransformerLens sets pad = eos where the tokenizer has no
pad token), so ``utils.get_attention_mask(model.tokenizer, ...)`` finds the padding; a ``padding_side``
set on ``model.tokenizer`` is the side the model pads on; and the shared GPT-2 tokenizer glassbox's own
models use is left as it was (glassbox's rule: no pad token, pads are BOS, the tokenizer's own side)."""

import copy

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL
import transformer_lens.utilities as tl_utils
from glassbox.models import gpt2_tokenizer
from tl_oracle import tiny_model, tl_twin

PROMPTS = ["Elizabeth read the letter", "and", "the garden was quiet at noon"]


@pytest.fixture()
def pair():
    model = tiny_model(2)
    ours = gtl.HookedTransformer.from_glassbox(model, fold_ln=False, center_writing_weights=False,
                                               center_unembed=False, fold_value_biases=False)
    theirs = tl_twin(model, tokenizer=copy.deepcopy(gpt2_tokenizer()))  # its own tokenizer: TL edits it
    return ours, theirs


def test_the_pad_token_is_eos_and_get_attention_mask_finds_the_padding(pair):
    ours, theirs = pair
    assert ours.tokenizer.pad_token == theirs.tokenizer.pad_token == "<|endoftext|>"
    assert ours.tokenizer.padding_side == theirs.tokenizer.padding_side == "right"
    toks = theirs.to_tokens(PROMPTS)
    assert torch.equal(ours.to_tokens(PROMPTS), toks)
    for side in ("right", "left"):
        ours.tokenizer.padding_side = theirs.tokenizer.padding_side = side  # TransformerLens reads this side
        for bos in (True, False):
            padded = theirs.to_tokens(PROMPTS, prepend_bos=bos)
            assert torch.equal(ours.to_tokens(PROMPTS, prepend_bos=bos), padded)
            want = tl_utils.get_attention_mask(theirs.tokenizer, padded, bos)
            got = gtl.utils.get_attention_mask(ours.tokenizer, padded, bos)
            assert want.sum() < want.numel()  # there is padding to find
            assert torch.equal(got, want), (side, bos)


def test_a_padding_side_set_on_the_tokenizer_is_the_models(pair):
    ours, theirs = pair
    ours.tokenizer.padding_side = theirs.tokenizer.padding_side = "left"
    assert ours.default_padding_side == "left"
    toks = theirs.to_tokens(PROMPTS)
    assert toks[1, 0] == theirs.tokenizer.pad_token_id  # padded on the left
    assert torch.equal(ours.to_tokens(PROMPTS), toks)
    real = tl_utils.get_attention_mask(theirs.tokenizer, toks, True).bool()
    with torch.no_grad():
        # the same weights and left-padded batch, at the real tokens (pads' logits are no one's):
        # measured 2.0e-6 (logits up to 4.5), bound 2e-5
        diff = (ours(PROMPTS) - theirs(PROMPTS)).abs().amax(-1)[real].max()
    assert diff < 2e-5
    _, cache = ours.run_with_cache(PROMPTS)
    assert torch.equal(cache.tokens, toks)


def test_the_shared_glassbox_tokenizer_is_unchanged(pair):
    ours, _ = pair
    ours.tokenizer.padding_side = "left"
    shared = gpt2_tokenizer()
    assert ours.tokenizer is not shared
    assert shared.pad_token is None and shared.padding_side == "right"


def test_default_padding_side_sets_the_tokenizers():
    model = gtl.HookedTransformer.from_glassbox(tiny_model(2), default_padding_side="left")
    cfg = TL.HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_head=4, d_vocab=50257, act_fn="relu")
    theirs = TL.HookedTransformer(cfg, tokenizer=copy.deepcopy(gpt2_tokenizer()), default_padding_side="left")
    assert model.tokenizer.padding_side == theirs.tokenizer.padding_side == "left"
    theirs.set_tokenizer(copy.deepcopy(gpt2_tokenizer()), default_padding_side="right")
    model.set_tokenizer(copy.deepcopy(gpt2_tokenizer()), default_padding_side="right")
    assert model.tokenizer.padding_side == theirs.tokenizer.padding_side == "right"
    assert model.tokenizer.pad_token == theirs.tokenizer.pad_token == "<|endoftext|>"
