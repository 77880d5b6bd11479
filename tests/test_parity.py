"""Logit and activation parity with transformers.GPT2LMHeadModel (eager attention).

The oracle is Hugging Face's implementation run on the same weights; tolerances are two-sided
(assert_close bounds |Δ| from both sides), 1e-5 in float32 and 1e-10 in float64.
"""

import pytest
import torch

from conftest import TINY, make_hf_gpt2
from glassbox.models import HookedTransformer


def hf_outputs(hf, tokens):
    with torch.no_grad():
        return hf(tokens, output_hidden_states=True, output_attentions=True)


def assert_parity(model, hf, tokens, atol):
    out = hf_outputs(hf, tokens)
    with torch.no_grad():
        logits = model(tokens)
    # measured 5.1e-15 (values up to 2.9), bound 1e-10: 19581x; measured 1.1e-6 (values up to 2.9), bound 1e-5: 9x
    torch.testing.assert_close(logits, out.logits, atol=atol, rtol=0)
    return out


@pytest.mark.parametrize("init", [0.02, 0.2], ids=["gpt2-init", "sharp-attention"])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_tiny_logits_match_transformers(dtype, atol, init, tiny_tokens):
    # At GPT-2's init (0.02) the tiny model's attention is nearly uniform; at 0.2 it is sharp, so a
    # mistake inside the attention moves the logits far past the bound (tests/test_bounds_catch_bugs.py).
    hf = make_hf_gpt2(dtype=dtype, initializer_range=init, **TINY)
    model = HookedTransformer.from_hf(hf)
    assert next(model.parameters()).dtype == dtype
    assert_parity(model, hf, tiny_tokens, atol)


def test_tiny_full_context_matches(tiny_hf, tiny_model):
    tokens = torch.randint(0, TINY["vocab_size"], (2, TINY["n_positions"]), generator=torch.Generator().manual_seed(5))
    assert_parity(tiny_model, tiny_hf, tokens, 1e-5)


def test_every_intermediate_matches(tiny_hf, tiny_model, tiny_tokens):
    out = hf_outputs(tiny_hf, tiny_tokens)
    names = [f"blocks.{L}.hook_resid_pre" for L in range(TINY["n_layer"])]
    names += [f"blocks.{L}.attn.hook_pattern" for L in range(TINY["n_layer"])]
    acts = {}
    hooks = [(name, lambda x, hook: acts.__setitem__(hook.name, x.detach())) for name in names + ["ln_final.hook_out"]]
    with torch.no_grad():
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=hooks)
    for L in range(TINY["n_layer"]):
        # measured 3.0e-8 (values up to 1), bound 1e-5: 336x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=1e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured 6.0e-8 (values up to 1), bound 1e-6: 17x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=1e-6, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")
    # HF's last hidden state is after ln_f.
    # measured 4.8e-7 (values up to 2.4), bound 1e-5: 21x
    torch.testing.assert_close(acts["ln_final.hook_out"], out.hidden_states[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_small_shape_logits_match(small_hf, dtype, atol):
    hf = small_hf.to(dtype)  # in place; restored below for the other tests sharing it
    try:
        model = HookedTransformer.from_hf(hf)
        tokens = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(2))
        out = assert_parity(model, hf, tokens, atol)
        for L in (0, 6, 11):
            # measured 6.2e-15 (values up to 4.9), bound 1e-10: 16084x; measured 1.7e-6 (values up to 4.9), bound 1e-5: 6x
            torch.testing.assert_close(_resid_pre(model, tokens, L), out.hidden_states[L], atol=atol, rtol=0,
                                       msg=lambda m, L=L: f"resid_pre of layer {L}: {m}")
    finally:
        small_hf.to(torch.float32)


def _resid_pre(model, tokens, layer):
    with torch.no_grad():
        return model(tokens, stop_at_layer=layer)
