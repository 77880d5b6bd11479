"""The shipped GPT-2 tokenizer and the one BOS policy."""

import pytest
import torch

from glassbox.models import Config, HookedTransformer


@pytest.fixture(scope="module")
def gpt2_vocab_model():
    cfg = Config(d_model=8, n_layers=1, n_heads=2, d_vocab=50257, n_ctx=32)
    return HookedTransformer(cfg)


def test_hello_world_ids(gpt2_vocab_model):
    m = gpt2_vocab_model
    assert m.tokenizer.encode("Hello world", add_special_tokens=False) == [15496, 995]
    assert m.to_tokens("Hello world", prepend_bos=False).tolist() == [[15496, 995]]
    assert m.to_tokens("Hello world").tolist() == [[50256, 15496, 995]]
    assert m.to_str_tokens("Hello world") == ["<|endoftext|>", "Hello", " world"]
    assert m.to_string(torch.tensor([15496, 995])) == "Hello world"
    assert m.to_single_token(" world") == 995
    with pytest.raises(ValueError, match="not one"):
        m.to_single_token("Hello world")


def test_bos_policy_is_the_same_everywhere(gpt2_vocab_model):
    m = gpt2_vocab_model
    for bos in (True, False):
        tokens = m.to_tokens("The cat", prepend_bos=bos)
        assert m.to_str_tokens("The cat", prepend_bos=bos) == [m.tokenizer.decode([t]) for t in tokens[0].tolist()]
        with torch.no_grad():
            torch.testing.assert_close(m("The cat", prepend_bos=bos), m(tokens), atol=0, rtol=0)


def test_list_input_pads_with_mask(gpt2_vocab_model):
    m = gpt2_vocab_model
    tokens, mask = m.tokenize(["Hello world", "Hi"], padding_side="left")
    assert tokens.tolist() == [[50256, 15496, 995], [50256, 50256, 17250]]
    assert mask.tolist() == [[True, True, True], [False, True, True]]


def test_text_problems_are_refused(gpt2_vocab_model):
    m = gpt2_vocab_model
    with pytest.raises(ValueError, match="tokenizes to no tokens"):
        m.to_tokens("", prepend_bos=False)
    with pytest.raises(ValueError, match="longer than n_ctx=32"):
        m.to_tokens("word " * 40)


def test_model_without_tokenizer_says_so():
    m = HookedTransformer(Config(d_model=8, n_layers=1, n_heads=2, d_vocab=31, n_ctx=8))
    with pytest.raises(ValueError, match="d_vocab=31.*has no tokenizer"):
        m.to_tokens("hi")
