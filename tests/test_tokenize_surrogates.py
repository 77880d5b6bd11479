"""Text holding a lone surrogate ("\ud800": half a UTF-16 pair, from a bad decode or a JSON escape) is
not Unicode text: every tokenizing entry point refuses it with a ValueError naming the text, the
position and the character, not the tokenizer's raw TypeError."""

import re

import pytest

from glassbox import HookedTransformer


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


CALLS = {
    "to_tokens": lambda m, t: m.to_tokens(t),
    "to_tokens list": lambda m, t: m.to_tokens(["fine", t]),
    "to_str_tokens": lambda m, t: m.to_str_tokens(t),
    "forward": lambda m, t: m(t),
    "loss": lambda m, t: m(t, return_type="loss"),
    "run_with_cache": lambda m, t: m.run_with_cache(t),
    "generate": lambda m, t: m.generate(t, max_new_tokens=2, verbose=False),
    "to_single_token": lambda m, t: m.to_single_token(t),
    "get_token_position": lambda m, t: m.get_token_position(" the", t),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("text,index", [("a\ud800b", 1), ("\udfff", 0), ("Elizabeth \udc80", 10)])
def test_a_lone_surrogate_is_named_at_every_entry_point(model, call, text, index):
    with pytest.raises(ValueError, match=re.escape(f"holds a lone surrogate {text[index]!r} at index {index}")):
        CALLS[call](model, text)


def test_the_tl_surface_refuses_it_too():
    from glassbox.tl import HookedTransformer as TLHookedTransformer

    tl_model = TLHookedTransformer.from_pretrained("glassbox-austen")
    with pytest.raises(ValueError, match="lone surrogate"):
        tl_model.to_tokens("x\ud800")


def test_a_pair_that_is_whole_tokenizes(model):
    assert model.to_str_tokens("a\U0001F600", prepend_bos=False)[0] == "a"
