"""Splicing against SAELens: run_with_cache_with_saes / run_with_saes on a glassbox model and on SAELens's
HookedSAETransformer with the same weights (the TransformerLens twin's), several SAEs at once.

The SAELens SAEs are built from the same tensors as the glassbox ones (SAELens's own classes, weights
copied in), so any difference is in the splicing or in the two models' rounding.
"""

import pytest
import torch
from sae_lens import HookedSAETransformer
from sae_lens.saes import StandardSAE as LensStandardSAE
from sae_lens.saes import StandardSAEConfig, Transcoder, TranscoderConfig
from sae_lens.saes.sae import SAEMetadata

from glassbox.interp.sae.base import SAE_HOOKS, StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.features import feature_acts
from tl_oracle import max_diff, tiny_gpt2, tl_twin, tokens

D_SAE = 37
# (hook read, hook written or None, reshape): an SAE in the residual stream, one over flattened heads, and
# a transcoder from ln2's normalised input to the MLP's output
PLACES = [("blocks.1.hook_resid_pre", None, "none"), ("blocks.1.attn.hook_z", None, "hook_z"),
          ("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", "none")]


@pytest.fixture(scope="module")
def models():
    model = tiny_gpt2(0, n_heads=3, d_head=8)
    twin = tl_twin(model)
    lens_model = HookedSAETransformer(twin.cfg, move_to_device=False, tokenizer=twin.tokenizer)
    lens_model.load_state_dict(twin.state_dict(), strict=False)
    return model, lens_model.eval()


def pair(read, write, reshape, seed):
    """A glassbox StandardSAE and an SAELens SAE (StandardSAE, or Transcoder) with the same tensors."""
    gb = StandardSAE(SAEConfig("standard", 24, D_SAE, read, hook_name_out=write, reshape_activations=reshape,
                               apply_b_dec_to_input=write is None))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (gb.W_enc, gb.W_dec):
            p.copy_(torch.randn(p.shape, generator=g) / 24 ** 0.5)
        for p in (gb.b_enc, gb.b_dec):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    meta = SAEMetadata(hook_name=read, model_name="tiny")
    if write is None:
        lens = LensStandardSAE(StandardSAEConfig(d_in=24, d_sae=D_SAE, reshape_activations=reshape, metadata=meta))
    else:
        meta.hook_name_out = write
        lens = Transcoder(TranscoderConfig(d_in=24, d_sae=D_SAE, d_out=24, apply_b_dec_to_input=False, metadata=meta))
    lens.load_state_dict({k: v.clone() for k, v in gb.state_dict().items()})
    return gb, lens.eval()


@pytest.fixture(scope="module")
def saes():
    pairs = [pair(*place, seed) for seed, place in enumerate(PLACES)]
    return [g for g, _ in pairs], [s for _, s in pairs]


@pytest.mark.parametrize("use_error_term", [False, True])
def test_run_with_cache_with_saes_equals_saelens(models, saes, use_error_term):
    model, lens_model = models
    ours, theirs = saes
    toks = tokens(model, batch=3, pos=9)
    with torch.no_grad():
        clean = model(toks)
        # caching hooks every point, which takes the unfused attention and LayerNorm paths: the clean run to
        # be equal to bit for bit is the cached one
        cached_clean = model.run_with_cache(toks)[0]
        got, got_cache = model.run_with_cache_with_saes(toks, saes=ours, use_error_term=use_error_term)
        want, want_cache = lens_model.run_with_cache_with_saes(toks, saes=theirs, use_error_term=use_error_term)
        lens_clean = lens_model(toks)
    assert model.splices == {} and lens_model.acts_to_saes == {}
    writes = [w or r for r, w, _ in PLACES]
    sae_keys = {f"{h}.{name}" for h in writes for name in SAE_HOOKS
                if use_error_term or name != "hook_sae_error"}
    # SAELens fires hook_sae_error only with the error term; glassbox always has the point, and it fires
    # (on x - recons) only with the error term too
    assert {k for k in got_cache.keys() if ".hook_sae_" in k} == sae_keys
    assert {k for k in want_cache.keys() if ".hook_sae_" in k} == sae_keys
    # SAELens stands its wrapper in place of the write hook, which leaves its cache; glassbox keeps it
    clean_keys, lens_clean_keys = set(model.run_with_cache(toks)[1].keys()), set(lens_model.run_with_cache(toks)[1].keys())
    assert set(got_cache.keys()) == clean_keys | sae_keys
    assert set(want_cache.keys()) == (lens_clean_keys - set(writes)) | sae_keys
    # here (logits up to 5) the twins differ by 2.7e-6; over prompts of 1 to n_ctx tokens, batches and padding on
    # random GPT-2 and Llama shapes by 8.3e-6 (measure_sae_splice.py): bound 3.5e-5, 4x
    assert max_diff(clean, lens_clean) <= 3.5e-5
    for name in sorted(sae_keys):
        assert got_cache[name].shape == want_cache[name].shape, name
    for name in [f"{h}.hook_sae_acts_post" for h in writes]:
        # the models' rounding reaches the SAEs' inputs: measured 1.2e-6 here (activations up to 4.5), 2.5e-6
        # over measure_sae_splice.py's sweep, bound 1e-5: 4x
        assert max_diff(got_cache[name], want_cache[name]) <= 1e-5, name
    for sae, name in zip(ours, writes):
        assert feature_acts(got_cache, sae) is got_cache[f"{name}.hook_sae_acts_post"]
    if use_error_term:
        assert torch.equal(got, cached_clean)  # glassbox: the clean model's logits bit for bit
        # SAELens adds (x - clean_recons) to recons: measured 1.9e-6 off its own clean logits, bound 2e-5: 10x
        assert max_diff(want, lens_clean) <= 2e-5
    else:
        assert max_diff(got, clean) > 0.05  # the reconstructions are carried on
    # measured 3.0e-6 without the error term, 2.9e-6 with it here (logits up to 5); over measure_sae_splice.py's
    # sweep on random models 4.7e-6 and 9.4e-6: bound 4e-5, 4x
    assert max_diff(got, want) <= 4e-5


def test_run_with_saes_and_a_feature_hook_equal_saelens(models, saes):
    """Zeroing one feature at the residual-stream SAE, error term on: both carry the clean error."""
    model, lens_model = models
    ours, theirs = saes
    toks = tokens(model, batch=2, pos=7, seed=3)
    name = "blocks.1.hook_resid_pre.hook_sae_acts_post"

    def zero(act, hook):
        act = act.clone()
        act[..., 4] = 0
        return act

    with torch.no_grad():
        got = model.run_with_hooks_with_saes(toks, saes=ours[:1], use_error_term=True, fwd_hooks=[(name, zero)])
        # SAELens's run_with_hooks_with_saes takes no use_error_term (it reads the SAE's own setting)
        lens_model.add_sae(theirs[0], use_error_term=True)
        try:
            want = lens_model.run_with_hooks(toks, fwd_hooks=[(name, zero)])
        finally:
            lens_model.reset_saes()
        plain = model.run_with_saes(toks, saes=ours[:1], use_error_term=True)
        lens_plain = lens_model.run_with_saes(toks, saes=theirs[:1], use_error_term=True)
    assert max_diff(got, plain) > 1e-3
    # measured (the 12 cases above) 4.5e-6 with the hook, 3.1e-6 without (logits up to 5), bound 5e-5: 11x
    assert max_diff(got, want) <= 5e-5
    assert max_diff(plain, lens_plain) <= 5e-5
