"""Hostile inputs: wrong token ids, shapes, dtypes, devices, masks, layer indices, hook names and
texts are refused with a ValueError/KeyError naming the offending value, at every public entry
point, before anything runs, and never by silently truncating or clamping.

Each refusal is checked for its message (the value must appear in it) and for leaving the model
clean: no hook attached afterwards. Arguments of the wrong Python type (a float layer index, a numpy
array of ids, a string dtype) are left out: in this suite the runtime type checker refuses them
before the library sees them, and test_shape_checking.py covers that checker.
"""

import pytest
import torch

from conftest import TINY
from glassbox.models import Config, HookedTransformer

V, N_CTX = TINY["vocab_size"], TINY["n_positions"]


@pytest.fixture(scope="module")
def text_model():
    """A tiny model with GPT-2's vocabulary, so that it tokenizes text with the shipped tokenizer."""
    torch.manual_seed(0)
    return HookedTransformer(Config(d_model=14, n_layers=2, n_heads=2, d_vocab=50257, n_ctx=11)).eval()


def ids(*rows):
    return torch.tensor(rows)


def refused(model, exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    assert not model.has_hooks, "a refused call left a hook attached"


# -- token ids ----------------------------------------------------------------------------------
ENTRY_POINTS = {
    "forward": lambda m, x: m(x),
    "run_with_cache": lambda m, x: m.run_with_cache(x),
    "run_with_hooks": lambda m, x: m.run_with_hooks(x, fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, hook: None)]),
    "generate": lambda m, x: m.generate(x, max_new_tokens=1, eos_token_id=None),
    "loss": lambda m, x: m(x, return_type="loss"),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("tokens,match", [
    (ids([1, 2, V]), rf"token id {V} is outside \[0, d_vocab={V}\)"),
    (ids([1, -3, 2]), r"token id -3 is outside"),
    (ids([2**40, 1]), rf"token id {2**40} is outside"),
    (torch.zeros(2, 0, dtype=torch.long), r"(empty: shape|positive ints, got) \(2, 0\)"),
    (torch.zeros(1, N_CTX + 1, dtype=torch.long), rf"{N_CTX + 1} tokens is longer than n_ctx={N_CTX}"),
])
def test_bad_token_ids_are_refused_at_every_entry_point(tiny_model, entry, tokens, match):
    refused(tiny_model, ValueError, match, ENTRY_POINTS[entry], tiny_model, tokens)


# run_with_cache and generate annotate their input as Int[Tensor, "batch pos"], so in this suite the
# shape checker refuses these before the library's own check; forward takes any tensor and checks.
@pytest.mark.parametrize("entry", ["forward", "run_with_hooks", "loss"])
@pytest.mark.parametrize("tokens,match", [
    (torch.tensor([[1.0, 2.0]]), r"integer tensor, got dtype torch.float32"),
    (torch.tensor([[True, False]]), r"integer tensor, got dtype torch.bool"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"\[batch pos\], got shape \(1, 2, 3\)"),
])
def test_token_dtype_and_shape_are_named(tiny_model, entry, tokens, match):
    refused(tiny_model, ValueError, match, ENTRY_POINTS[entry], tiny_model, tokens)


def test_small_integer_dtypes_are_ids_too(tiny_model):
    tokens = ids([3, 1, 4, 1, 5])
    with torch.no_grad():
        expected = tiny_model(tokens)
        for dtype in (torch.int32, torch.int16, torch.uint8):
            torch.testing.assert_close(tiny_model(tokens.to(dtype)), expected, atol=0, rtol=0, msg=str(dtype))


def test_a_list_of_ids_is_not_text(tiny_model):
    # A list is text input; a list of ints is not text and is refused, not tokenized.
    refused(tiny_model, ValueError, "string or a non-empty list of strings", tiny_model.run_with_cache, [1, 2])


def test_meta_device_ids_are_refused(tiny_model):
    refused(tiny_model, ValueError, "meta device", tiny_model, torch.zeros(1, 3, dtype=torch.long, device="meta"))


# -- masks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask,exc,match", [
    (torch.ones(1, 4), ValueError, r"attention_mask has shape \(1, 4\), tokens have \(1, 3\)"),
    (torch.tensor([[1.0, 0.5, 1.0]]), ValueError, r"attention_mask holds 0.5"),
    (torch.tensor([[1, 2, 1]]), ValueError, r"attention_mask holds 2"),
    (torch.tensor([[0, 0, 0]]), ValueError, r"attention_mask row 0 has no real token"),
])
def test_bad_attention_masks_are_refused(tiny_model, mask, exc, match):
    tokens = ids([1, 2, 3])
    refused(tiny_model, exc, match, tiny_model, tokens, attention_mask=mask)
    refused(tiny_model, exc, match, tiny_model.run_with_cache, tokens, attention_mask=mask)


def test_mask_with_text_input_is_refused(text_model):
    refused(text_model, ValueError, "derived from text input", text_model, "hello", attention_mask=torch.ones(1, 2))


# -- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(return_type="probs"), r"return_type must be one of .* got 'probs'"),
    (dict(stop_at_layer=3), r"stop_at_layer=3 must be an int in \[-n_layers, n_layers\] = \[-2, 2\]"),
    (dict(stop_at_layer=-3), r"stop_at_layer=-3 must be an int"),
])
def test_bad_forward_options_are_named(tiny_model, kwargs, match):
    refused(tiny_model, ValueError, match, tiny_model, ids([1, 2, 3]), **kwargs)


def test_stop_at_layer_in_range_agrees_with_hooks(tiny_model):
    """The accepted range really means what it says: -1 stops before the last block."""
    tokens = ids([1, 2, 3, 4])
    with torch.no_grad():
        _, cache = tiny_model.run_with_cache(tokens, names_filter=lambda n: n.endswith("resid_pre"))
        torch.testing.assert_close(tiny_model(tokens, stop_at_layer=-1), cache["blocks.1.hook_resid_pre"], atol=0, rtol=0)
        torch.testing.assert_close(tiny_model(tokens, stop_at_layer=1), cache["blocks.1.hook_resid_pre"], atol=0, rtol=0)


@pytest.mark.parametrize("resid,kwargs,match", [
    (torch.zeros(1, 3, TINY["n_embd"], dtype=torch.float64), dict(start_at_layer=1),
     r"residual stream has dtype torch.float64, the model torch.float32"),
    (torch.zeros(1, 3, TINY["n_embd"] + 1), dict(start_at_layer=1), r"\[batch pos d_model=15\], got \(1, 3, 16\)"),
    (torch.zeros(1, N_CTX + 2, TINY["n_embd"]), dict(start_at_layer=1), rf"{N_CTX + 2} positions is longer than n_ctx"),
    (torch.zeros(1, 3, TINY["n_embd"]), dict(start_at_layer=3), r"start_at_layer=3 is outside \[0, n_layers=2\]"),
    (torch.zeros(1, 3, TINY["n_embd"]), dict(start_at_layer=2, stop_at_layer=1), r"stop_at_layer=1 ends before start_at_layer=2"),
])
def test_bad_residual_stream_input_is_named(tiny_model, resid, kwargs, match):
    refused(tiny_model, ValueError, match, tiny_model, resid, **kwargs)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(device="nonsense"), ValueError, r"device 'nonsense' is not a torch device"),
    (dict(dtype=torch.int64), ValueError, r"dtype must be a floating torch.dtype .* got torch.int64"),
    (dict(names_filter=["blocks.0.hook_resid_pre", "blocks.7.hook_resid_pre"]), KeyError, r"'blocks.7.hook_resid_pre'"),
    (dict(remove_batch_dim=True), ValueError, r"batch of 1, got 3 sequences"),
])
def test_bad_cache_options_fail_before_the_forward(tiny_model, tiny_tokens, kwargs, exc, match):
    calls = []
    with tiny_model.hooks([("hook_embed", lambda act, hook: calls.append(1))]):
        refused_inside = pytest.raises(exc, match=match)
        with refused_inside:
            tiny_model.run_with_cache(tiny_tokens, **kwargs)
    assert calls == [], "the forward ran before the bad option was noticed"
    assert not tiny_model.has_hooks


def test_cache_keys_that_do_not_exist_name_the_key(tiny_model, tiny_tokens):
    _, cache = tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: "attn" in n)
    with pytest.raises(KeyError, match=r"blocks.5.attn.hook_pattern"):
        cache["pattern", 5]
    with pytest.raises(KeyError, match=r"'blocks.0.attn.hook_patern'.*blocks.0.attn.hook_pattern"):
        cache["blocks.0.attn.hook_patern"]
    with pytest.raises(KeyError, match=r"was not cached by this run"):
        cache["blocks.0.hook_resid_pre"]


# -- hooks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fwd_hooks,exc,match", [
    ([("blocks.0.attn.hook_patern", lambda a, hook: None)], KeyError, r"'blocks.0.attn.hook_patern'.*closest"),
    ([("blocks.9.hook_resid_pre", lambda a, hook: None)], KeyError, r"'blocks.9.hook_resid_pre'"),
    ([("blocks.0.hook_resid_pre",)], ValueError, r"\(name_or_filter, fn\) pair, got \('blocks.0.hook_resid_pre',\)"),
    ([("blocks.0.hook_resid_pre", lambda a, hook: a.double())], ValueError,
     r"hook at blocks.0.hook_resid_pre returned shape \(3, 11, 15\) torch.float64, expected .* torch.float32"),
    ([("blocks.1.attn.hook_pattern", lambda a, hook: a[..., :-1])], ValueError,
     r"hook at blocks.1.attn.hook_pattern returned shape \(3, 3, 11, 10\)"),
    ([("blocks.0.hook_mlp_out", lambda a, hook: [a])], TypeError, r"blocks.0.hook_mlp_out returned list"),
])
def test_bad_hooks_are_named_and_removed(tiny_model, tiny_tokens, fwd_hooks, exc, match):
    refused(tiny_model, exc, match, tiny_model.run_with_hooks, tiny_tokens, fwd_hooks=fwd_hooks)


def test_bad_hook_direction_is_named(tiny_model):
    refused(tiny_model, ValueError, r"'fwd' or 'bwd', got 'sideways'", tiny_model.add_hook, "hook_embed",
            lambda a, hook: None, dir="sideways")


# -- text ---------------------------------------------------------------------------------------
def test_text_that_tokenizes_to_nothing_is_refused(text_model):
    for fn in (text_model, text_model.to_tokens, text_model.run_with_cache):
        refused(text_model, ValueError, r"text '' tokenizes to no tokens", fn, "", prepend_bos=False)
    refused(text_model, ValueError, r"text '' tokenizes to no tokens", text_model, ["fine", ""], prepend_bos=False)
    refused(text_model, ValueError, r"'' is 0 tokens, not one", text_model.to_single_token, "")
    refused(text_model, ValueError, r"non-empty list of strings", text_model, [])
    refused(text_model, ValueError, r"non-empty list of strings", text_model, ["a", 3])


def test_text_longer_than_n_ctx_is_refused_not_truncated(text_model):
    text = " word" * 11  # 11 tokens: with the BOS 12 > n_ctx = 11, without it exactly n_ctx
    for fn in (text_model, text_model.to_tokens, text_model.run_with_cache, text_model.tokenize):
        refused(text_model, ValueError, r"text tokenizes to 12 tokens, longer than n_ctx=11", fn, text)
    # One long prompt in a batch is enough to refuse the batch, instead of cutting that prompt.
    refused(text_model, ValueError, r"12 tokens, longer than n_ctx=11", text_model, ["short", text])
    # Exactly n_ctx is accepted, whole.
    tokens = text_model.to_tokens(text, prepend_bos=False)
    assert tokens.shape == (1, 11) and text_model.to_string(tokens[0]) == text


def test_generation_past_n_ctx_is_refused(text_model):
    refused(text_model, ValueError, r"5 prompt tokens \+ max_new_tokens=7 exceed n_ctx=11", text_model.generate,
            torch.zeros(1, 5, dtype=torch.long), max_new_tokens=7)
    refused(text_model, ValueError, r"max_new_tokens must be an int >= 0, got -1", text_model.generate,
            torch.zeros(1, 5, dtype=torch.long), max_new_tokens=-1)


def test_kv_cache_continuation_past_n_ctx_is_refused(tiny_model):
    from glassbox.models import KVCache

    kv = KVCache(TINY["n_layer"])
    with torch.no_grad():
        tiny_model(torch.zeros(1, N_CTX - 1, dtype=torch.long), past_kv_cache=kv)
        refused(tiny_model, ValueError, rf"sequence of {N_CTX + 1} tokens is longer than n_ctx={N_CTX}",
                tiny_model, torch.zeros(1, 2, dtype=torch.long), past_kv_cache=kv)
