"""Features in the analysis tools (glassbox.interp.sae.features).

Oracles: the SAE written out by hand from its weights; the spliced run's own hook points
(hook_sae_acts_post, hook_sae_error); glassbox's logit_attrs (tested against TransformerLens) on a
stack of each feature's residual-stream output; a hand computation of one attribution; torch.sort.
"""

import pytest
import torch

from glassbox.interp.resid import logit_attrs
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.features import decompose, feature_acts, feature_logit_attrs, top_features
from glassbox.models import Config, HookedTransformer

CFG = Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16)
D_SAE = 37
PLACES = {
    "resid_pre": ("blocks.1.hook_resid_pre", None, 24, "none"),
    "mlp_out": ("blocks.1.hook_mlp_out", None, 24, "none"),
    "hook_z": ("blocks.1.attn.hook_z", None, 24, "hook_z"),
    "mlp_post": ("blocks.0.mlp.hook_post", None, 40, "none"),
    "transcoder": ("blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out", 24, "none"),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = HookedTransformer(CFG)
    with torch.no_grad():  # LayerNorm weights and biases away from 1 and 0
        for name, p in m.named_parameters():
            if name.endswith(".w"):
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith(".b"):
                p.copy_(0.2 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.d_vocab, (3, 9), generator=torch.Generator().manual_seed(1))


def make_sae(place: str, seed: int = 0) -> StandardSAE:
    read, write, d_in, reshape = PLACES[place]
    sae = StandardSAE(SAEConfig("standard", d_in, D_SAE, read, hook_name_out=write, reshape_activations=reshape))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec):
            p.copy_(torch.randn(p.shape, generator=g) / d_in ** 0.5)
        for p in (sae.b_enc, sae.b_dec):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return sae


def hand_acts(sae, x):
    flat = x.flatten(-2) if sae.cfg.reshape_activations == "hook_z" else x
    return torch.relu((flat - sae.b_dec) @ sae.W_enc + sae.b_enc)


@pytest.mark.parametrize("place", list(PLACES))
def test_feature_acts_from_a_clean_or_a_spliced_cache(model, tokens, place):
    sae = make_sae(place)
    read, write = PLACES[place][:2]
    _, clean = model.run_with_cache(tokens)
    with model.saes([sae], use_error_term=True):
        _, spliced = model.run_with_cache(tokens)
    from_clean, from_spliced = feature_acts(clean, sae), feature_acts(spliced, sae)
    assert from_spliced is spliced[f"{write or read}.hook_sae_acts_post"]
    assert from_clean.shape == (3, 9, D_SAE)
    assert torch.equal(from_clean, from_spliced)
    with torch.no_grad():
        expected = hand_acts(sae, clean[read])
    assert (expected > 0).float().mean() > 0.2  # many features active
    # measured 0 (acts up to 2.7), bound 1e-6
    torch.testing.assert_close(from_clean, expected, rtol=0, atol=1e-6)
    assert not any(p.fwd_hooks for p in sae.hook_dict.values())


@pytest.mark.parametrize("place", ["resid_pre", "hook_z", "mlp_post", "transcoder"])
def test_decomposition_parts_sum_to_the_value(model, tokens, place):
    sae = make_sae(place)
    read, write = PLACES[place][:2]
    with model.saes([sae], use_error_term=True):
        _, cache = model.run_with_cache(tokens)
    parts = decompose(cache, sae)
    value = cache[write or read]
    flat = value.flatten(-2) if place == "hook_z" else value
    assert torch.equal(parts.value, flat)
    contributions = parts.contributions()
    assert contributions.shape == (D_SAE, 3, 9, sae.cfg.d_in)
    total = contributions.sum(0) + parts.b_dec + parts.error
    # measured 3.3e-7 (values up to 0.29), bound 5e-6: 15x
    torch.testing.assert_close(total, flat, rtol=0, atol=5e-6)
    # the error is what the spliced run's hook_sae_error saw (computed there independently)
    error = cache[f"{write or read}.hook_sae_error"]
    # measured 0 (errors up to 2.6), bound 1e-6
    torch.testing.assert_close(parts.error, error.flatten(-2) if place == "hook_z" else error, rtol=0, atol=1e-6)
    some = parts.contributions([5, 0])
    assert torch.equal(some[1], contributions[0]) and torch.equal(some[0], contributions[5])


def feature_stack(model, sae, cache, place):
    """[feature batch pos d_model]: each feature's output in the residual stream, written out by hand."""
    acts = hand_acts(sae, cache[PLACES[place][0]])
    vecs = sae.W_dec
    if place == "hook_z":
        vecs = torch.einsum("fhe,hed->fd", sae.W_dec.reshape(D_SAE, 3, 8), model.blocks[1].attn.W_O)
    elif place == "mlp_post":
        vecs = sae.W_dec @ model.blocks[0].mlp.W_out
    return acts.permute(2, 0, 1)[..., None] * vecs[:, None, None, :]


@pytest.mark.parametrize("place", list(PLACES))
def test_feature_logit_attrs_equal_logit_attrs_of_each_features_output(model, tokens, place):
    sae = make_sae(place)
    _, cache = model.run_with_cache(tokens)
    correct = torch.randint(0, CFG.d_vocab, (3, 9), generator=torch.Generator().manual_seed(2))
    wrong = torch.randint(0, CFG.d_vocab, (3,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        attrs = feature_logit_attrs(cache, sae, correct, wrong)
        expected = logit_attrs(cache, feature_stack(model, sae, cache, place), correct,
                               wrong[:, None].expand(3, 9), incl_bias=False)
    assert attrs.shape == (3, 9, D_SAE)
    assert expected.abs().max() > 0.1
    # measured 1.4e-6 (attributions up to 6.0, at mlp.hook_post), bound 1.5e-5: 10x
    torch.testing.assert_close(attrs, expected.permute(1, 2, 0), rtol=0, atol=1.5e-5)
    picked = feature_logit_attrs(cache, sae, correct, wrong, features=[7, 2])
    # measured 1.2e-7 (values up to 2.2), bound 2e-6: 17x
    torch.testing.assert_close(picked, attrs[..., [7, 2]], rtol=0, atol=2e-6)


def test_one_attribution_by_hand(model, tokens):
    sae = make_sae("mlp_out")
    _, cache = model.run_with_cache(tokens)
    b, p, f, t = 1, 4, int(feature_acts(cache, sae)[1, 4].argmax()), 17
    with torch.no_grad():
        a = hand_acts(sae, cache["blocks.1.hook_mlp_out"])[b, p, f]
        d = sae.W_dec[f] - sae.W_dec[f].mean()
        expected = a * (d * model.ln_final.w) @ model.W_U[:, t] / cache["ln_final.hook_scale"][b, p, 0]
        got = feature_logit_attrs(cache, sae, t)[b, p, f]
    assert abs(float(expected)) > 1e-2
    # measured 0 (value 0.07), bound 1e-6
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_features_error_and_bias_make_the_hooks_attribution(model, tokens):
    """At the last layer's mlp_out: sum over features + error + b_dec = logit_attrs of the hook's value."""
    sae = make_sae("mlp_out")
    _, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        parts = decompose(cache, sae)
        feats = feature_logit_attrs(cache, sae, 11).sum(-1)
        rest = logit_attrs(cache, torch.stack([parts.error, parts.b_dec.expand_as(parts.error)]), 11,
                           incl_bias=False).sum(0)
        whole = logit_attrs(cache, cache["blocks.1.hook_mlp_out"][None], 11, incl_bias=False)[0]
    # measured 3.3e-7 (values up to 0.03), bound 5e-6: 15x
    torch.testing.assert_close(feats + rest, whole, rtol=0, atol=5e-6)


def test_top_features(model, tokens):
    sae = make_sae("resid_pre")
    _, cache = model.run_with_cache(tokens)
    values, indices = top_features(cache, sae, k=4)
    acts = feature_acts(cache, sae)
    assert values.shape == indices.shape == (3, 9, 4)
    assert torch.equal(values, acts.sort(-1, descending=True).values[..., :4])
    assert torch.equal(acts.gather(-1, indices), values)
    assert torch.equal(top_features(acts, k=4)[1], indices)
    with pytest.raises(ValueError, match="k must be an int in \\[1, d_sae=37\\]"):
        top_features(acts, k=38)


def test_refusals(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: "resid_pre" in n)
    sae = make_sae("mlp_out")
    with pytest.raises(KeyError, match="'blocks.1.hook_mlp_out'"):
        feature_acts(cache, sae)
    _, cache = model.run_with_cache(tokens)
    ln = StandardSAE(SAEConfig("standard", 24, 5, "blocks.0.ln1.hook_normalized"))
    with pytest.raises(ValueError, match="no direct path to the logits is defined for an SAE writing at "
                                         "'blocks.0.ln1.hook_normalized'"):
        feature_logit_attrs(cache, ln, 3)
    with pytest.raises(ValueError, match="tokens of shape \\(2,\\)"):
        feature_logit_attrs(cache, sae, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="token id 50 is outside"):
        feature_logit_attrs(cache, sae, 50)
    torch.manual_seed(0)
    capped = HookedTransformer(Config(n_layers=1, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16,
                                      normalization="RMS", output_logits_soft_cap=30.0))
    _, cache = capped.run_with_cache(tokens)
    with pytest.raises(ValueError, match="soft-caps"):
        feature_logit_attrs(cache, StandardSAE(SAEConfig("standard", 24, 5, "blocks.0.hook_mlp_out")), 3)


def test_a_skip_transcoders_decomposition_has_its_skip_term(model, tokens):
    from glassbox.interp.sae.architectures import make_sae as make_arch

    read, write = "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"
    sae = make_arch(SAEConfig("skip_transcoder", 24, D_SAE, read, hook_name_out=write, apply_b_dec_to_input=False))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 5)
    with model.saes([sae], use_error_term=True):
        _, cache = model.run_with_cache(tokens)
    parts = decompose(cache, sae)
    with torch.no_grad():
        assert torch.equal(parts.skip, cache[read] @ sae.W_skip.T)
    total = parts.contributions().sum(0) + parts.b_dec + parts.skip + parts.error
    # measured 7.1e-7 (parts up to ~1 cancelling to values up to 0.012), bound 8e-6: 11x
    torch.testing.assert_close(total, cache[write], rtol=0, atol=8e-6)
    # measured 0, bound 1e-6: the splice's error term counts the skip term as written
    torch.testing.assert_close(parts.error, cache[f"{write}.hook_sae_error"], rtol=0, atol=1e-6)
