"""A HookedTransformer subclass that builds only the tokenizer, against TransformerLens 3.9.

TransformerLens's own tests define ``TokenizerOnlyHookedTransformer``: its ``__init__`` never calls
``super().__init__()`` (so nn.Module's state does not exist), sets ``self.cfg`` and calls
``set_tokenizer``; then ``to_tokens`` / ``to_str_tokens`` / ``to_string`` must work. The same subclass is
defined here on both classes and must tokenize identically, with d_vocab 50257 (GPT-2) and 50304
(Pythia's padded embedding with a smaller tokenizer, which TransformerLens accepts).
"""

import copy

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL
from glassbox.models import gpt2_tokenizer

PROMPT = "Hello world!"
PROMPTS = ["Italy is in Europe.", "Seoul is the capital of South Korea."]


def tokenizer_only(base):
    class TokenizerOnly(base):
        def __init__(self, cfg, tokenizer=None, default_padding_side="right"):
            self.cfg = cfg  # no super().__init__(): nn.Module's _parameters, _modules... never exist
            self.set_tokenizer(tokenizer, default_padding_side=default_padding_side)

    return TokenizerOnly


def config(module, d_vocab):
    return module.HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=32, d_head=4, n_heads=2, d_vocab=d_vocab,
                                          act_fn="gelu_new", tokenizer_name="gpt2", device="cpu")


@pytest.mark.parametrize("d_vocab", [50257, 50304])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_subclass_without_module_state_tokenizes_as_transformer_lens(d_vocab, side):
    ours = tokenizer_only(gtl.HookedTransformer)(config(gtl, d_vocab), copy.deepcopy(gpt2_tokenizer()), side)
    theirs = tokenizer_only(TL.HookedTransformer)(config(TL, d_vocab), copy.deepcopy(gpt2_tokenizer()), side)
    assert "_parameters" not in ours.__dict__  # the case under test: an uninitialised nn.Module
    assert ours.tokenizer.padding_side == theirs.tokenizer.padding_side == side
    for bos in (None, True, False):
        for text in (PROMPT, PROMPTS):
            want = theirs.to_tokens(text, prepend_bos=bos)
            got = ours.to_tokens(text, prepend_bos=bos)
            assert got.device == want.device and torch.equal(got, want), (text, bos)
            assert ours.to_str_tokens(text, prepend_bos=bos) == theirs.to_str_tokens(text, prepend_bos=bos)
            assert ours.to_string(got) == theirs.to_string(want)
        for pad in ("left", "right"):
            assert torch.equal(ours.to_tokens(PROMPTS, prepend_bos=bos, padding_side=pad),
                               theirs.to_tokens(PROMPTS, prepend_bos=bos, padding_side=pad)), (bos, pad)
    ours.cfg.default_prepend_bos = theirs.cfg.default_prepend_bos = False
    ours.tokenizer.padding_side = theirs.tokenizer.padding_side = "left" if side == "right" else "right"
    assert torch.equal(ours.to_tokens(PROMPTS), theirs.to_tokens(PROMPTS))


def test_a_tokenizer_larger_than_d_vocab_is_refused_naming_both_sizes():
    cls = tokenizer_only(gtl.HookedTransformer)
    with pytest.raises(ValueError, match=r"50257 tokens.*d_vocab=50000"):
        cls(config(gtl, 50000), copy.deepcopy(gpt2_tokenizer()))
    with pytest.raises(ValueError, match=r"tokenizer_name='gpt2'.*50257 tokens.*d_vocab=50000"):
        gtl.HookedTransformer(config(gtl, 50000))
    cfg = config(gtl, 50000)
    cfg.tokenizer_name = None
    model = gtl.HookedTransformer(cfg)  # built without one: set it later
    with pytest.raises(ValueError, match=r"50257 tokens.*d_vocab=50000"):
        model.set_tokenizer(copy.deepcopy(gpt2_tokenizer()))
