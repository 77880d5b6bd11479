"""GPT-2's options beyond GPT-2 small: every activation_function transformers accepts (two refused),
scale_attn_by_inverse_layer_idx and scale_attn_weights=False (the Stanford GPT-2 family),
reorder_and_upcast_attn. The oracle is transformers' GPT2LMHeadModel (eager attention) on the same
seeded random weights, and ``transformers.activations.ACT2FN`` for the activations themselves."""

import pytest
import torch

from conftest import TINY, make_hf_gpt2
from glassbox.models import HookedTransformer
from glassbox.models.activations import ACTIVATIONS, PARAMETRISED_ACTIVATIONS
from glassbox.weights.gpt2 import config_from_hf, config_to_hf

VARIANTS = {
    "inverse_layer_idx": dict(scale_attn_by_inverse_layer_idx=True),
    "unscaled": dict(scale_attn_weights=False),
    "upcast": dict(reorder_and_upcast_attn=True),
    "stanford": dict(scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True),
}
TOKENS = torch.randint(0, TINY["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def hf_variant(dtype=torch.float64, seed=0, **options):
    # initializer 0.2: sharp attention, so a wrong scale moves the logits far past any bound
    return make_hf_gpt2(seed=seed, dtype=dtype, initializer_range=0.2, **TINY, **options)


def test_every_activation_equals_transformers():
    from transformers.activations import ACT2FN

    x = torch.linspace(-12, 12, 2001, dtype=torch.float64)
    assert set(ACTIVATIONS) | set(PARAMETRISED_ACTIVATIONS) == set(ACT2FN), "a transformers activation is unmapped"
    for name, fn in ACTIVATIONS.items():
        expected = ACT2FN[name](x)
        # measured <= 1.8e-15 (values up to 12), bound 2e-14: 11x
        torch.testing.assert_close(fn(x), expected, atol=2e-14, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_gpt2_of_each_activation_matches(act):
    hf = hf_variant(activation_function=act)
    model = HookedTransformer.from_hf(hf)
    assert model.cfg.act_fn == act
    with torch.no_grad():
        expected = hf(TOKENS).logits
        # measured <= 1.8e-15 (logits up to 3) in float64, bound 1e-12: 560x
        torch.testing.assert_close(model(TOKENS), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("act", PARAMETRISED_ACTIVATIONS)
def test_parametrised_activations_are_refused_by_name(act):
    from transformers import GPT2Config

    with pytest.raises(ValueError, match=f"activation_function '{act}' has learned parameters"):
        config_from_hf(GPT2Config(**TINY, activation_function=act))


# transformers' reorder_and_upcast_attn path refuses float64 ("attn_weights does not have dtype
# torch.float32"), so those variants are compared in float32 only.
CASES = [(v, torch.float32, 1e-5) for v in sorted(VARIANTS)] + [
    (v, torch.float64, 1e-12) for v in sorted(VARIANTS) if not VARIANTS[v].get("reorder_and_upcast_attn")]


@pytest.mark.parametrize("variant,dtype,atol", CASES)
def test_variant_logits_and_every_layer_match(variant, dtype, atol):
    hf = hf_variant(dtype=dtype, **VARIANTS[variant])
    model = HookedTransformer.from_hf(hf)
    acts = {}
    with torch.no_grad():
        out = hf(TOKENS, output_hidden_states=True)
        logits = model.run_with_hooks(TOKENS, fwd_hooks=[(lambda n: n.endswith("resid_pre"),
                                                          lambda x, hook: acts.__setitem__(hook.name, x))])
    assert out.logits.abs().max() > 1
    # float32: measured <= 7.2e-7 (logits up to 2.9), bound 1e-5: 14x; float64: measured <= 1.2e-15, bound 1e-12: 830x
    torch.testing.assert_close(logits, out.logits, atol=atol, rtol=0)
    for L in range(TINY["n_layer"]):
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=atol, rtol=0)


def test_options_change_the_computation():
    """Each option moves the logits away from plain GPT-2's (so the parity above is not vacuous)."""
    plain = HookedTransformer.from_hf(hf_variant())
    with torch.no_grad():
        base = plain(TOKENS)
        for variant in ("inverse_layer_idx", "unscaled"):
            other = HookedTransformer.from_hf(hf_variant(**VARIANTS[variant]))(TOKENS)
            assert (other - base).abs().max() > 0.01, variant  # layer 0 is / 1: only layer 1 moves


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["upcast", "stanford", "unscaled"])
def test_half_precision_error_no_worse_than_transformers(variant, dtype):
    plain = {k: v for k, v in VARIANTS[variant].items() if k != "reorder_and_upcast_attn"}
    ref_hf = hf_variant(**plain)  # the float64 reference (transformers' upcast path refuses float64)
    with torch.no_grad():
        reference = ref_hf(TOKENS).logits
        hf_half = hf_variant(dtype=dtype, **VARIANTS[variant])
        hf_err = (hf_half(TOKENS).logits.double() - reference).abs().mean()
        ours = HookedTransformer.from_hf(ref_hf, dtype=dtype)
        our_err = (ours(TOKENS).double() - reference).abs().mean()
    # measured ratio of mean |error| ours / transformers' 0.96..1.03 over these six cases; bound 1.2
    assert our_err <= 1.2 * hf_err, f"{variant} {dtype}: ours {our_err:.3g}, transformers {hf_err:.3g}"


def test_generation_and_left_padding_match():
    hf = hf_variant(dtype=torch.float32, **VARIANTS["stanford"])
    model = HookedTransformer.from_hf(hf)
    prompt = TOKENS[:, :5]
    with torch.no_grad():
        ours = model.generate(prompt, max_new_tokens=7, do_sample=False, eos_token_id=None)
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=7, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        assert torch.equal(ours, theirs)
        row = TOKENS[:1, :9]
        padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), row], dim=1)
        mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 9)], dim=1)
        # measured 9.5e-7 (logits up to 2.4), bound 1e-5: 10x
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 4:], model(row), atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_back_loads_with_no_missing_keys_and_equal_logits(variant, tmp_path):
    from transformers import GPT2LMHeadModel

    hf = hf_variant(dtype=torch.float32, **VARIANTS[variant])
    model = HookedTransformer.from_hf(hf)
    exported = config_to_hf(model.cfg)
    for key, value in {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                       "reorder_and_upcast_attn": False, **VARIANTS[variant]}.items():
        assert getattr(exported, key) == value, key
    model.save_pretrained(tmp_path)
    reloaded, info = GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="eager",
                                                     dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        torch.testing.assert_close(reloaded(TOKENS).logits, hf(TOKENS).logits, atol=0, rtol=0)


def test_export_refuses_what_gpt2_cannot_hold():
    cfg = config_from_hf(hf_variant().config)
    with pytest.raises(ValueError, match=r"GPT-2 cannot represent \{'attn_scale': 0.5\}"):
        config_to_hf(cfg.replace(attn_scale=0.5))
    with pytest.raises(ValueError, match="GPT-2 cannot represent.*'output_logits_soft_cap': 30.0"):
        config_to_hf(cfg.replace(output_logits_soft_cap=30.0))
