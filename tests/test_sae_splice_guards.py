"""Guards around splicing and feature decompositions: what would otherwise be silently wrong.

Oracles: the spliced run's own ``hook_sae_error`` (what the model added) for the decomposition of a
TopK SAE whose activations are rescaled by decoder norms; a hand-written forward for a transcoder
whose read hook did not run; the SAE's hook names.
"""

import copy

import pytest
import torch

from glassbox.interp.sae.architectures import BatchTopKSAE, TopKSAE, Transcoder
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.features import decompose, feature_logit_attrs
from glassbox.interp.sae.format import save_sae
from glassbox.models import Config, HookedTransformer

CFG = Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))


def randomize(sae, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 2 else 0.2))
    return sae


def test_rescaled_topk_decomposition_error_is_the_spliced_error(model, tokens):
    cfg = SAEConfig("topk", 24, 40, "blocks.1.hook_resid_pre", k=5, rescale_acts_by_decoder_norm=True)
    sae = randomize(TopKSAE(cfg))
    norms = sae.W_dec.norm(dim=-1)
    assert (norms - 1).abs().min() > 0.5  # far from unit rows, so a W_dec-only decomposition would be wrong
    with model.saes([sae], use_error_term=True):
        _, cache = model.run_with_cache(tokens)
    parts = decompose(cache, sae)
    # measured 2.4e-7 (error) and 3.0e-7 (reconstruction), values up to 3.8, bound 3e-6: 10x; decoder norms
    # 1.8 to 3.1, so a decomposition by W_dec alone would be off by about the activations themselves
    assert (parts.error - cache["blocks.1.hook_resid_pre.hook_sae_error"]).abs().max() < 3e-6
    assert (parts.reconstruction() - cache["blocks.1.hook_resid_pre.hook_sae_recons"]).abs().max() < 3e-6


def test_normalising_saes_are_refused_by_the_decomposition(model, tokens):
    sae = randomize(StandardSAE(SAEConfig("standard", 24, 40, "blocks.1.hook_resid_pre",
                                          normalize_activations="constant_norm_rescale")))
    with model.saes([sae], use_error_term=True):
        _, cache = model.run_with_cache(tokens)
    for fn in (lambda: decompose(cache, sae), lambda: feature_logit_attrs(cache, sae, 3)):
        with pytest.raises(ValueError, match="constant_norm_rescale.*blocks.1.hook_resid_pre|normalises"):
            fn()


def test_batch_dependent_sae_is_refused_and_its_inference_form_splices(model, tokens):
    sae = randomize(BatchTopKSAE(SAEConfig("batchtopk", 24, 40, "blocks.1.hook_resid_pre", k=4.0)))
    with pytest.raises(ValueError, match="whole batch.*to_jumprelu"):
        model.add_sae(sae)
    assert model.acts_to_saes == {}
    with model.saes([sae.to_jumprelu()]):
        model(tokens)


def test_an_sae_spliced_into_one_model_is_refused_by_another(model):
    other = HookedTransformer(CFG)
    sae = randomize(StandardSAE(SAEConfig("standard", 24, 40, "blocks.0.hook_resid_post")))
    with model.saes([sae]):
        with pytest.raises(ValueError, match="another model.*blocks.0.hook_resid_post.hook_sae_input"):
            other.add_sae(sae)
        other.add_sae(copy.deepcopy(sae))  # a copy is its own SAE
        other.reset_saes()
    assert sae.hook_sae_input.name == "hook_sae_input"


def test_transcoder_does_not_read_a_capture_left_by_an_earlier_forward(model, tokens):
    cfg = SAEConfig("transcoder", 24, 30, "blocks.0.hook_resid_post", hook_name_out="blocks.1.hook_mlp_out",
                    apply_b_dec_to_input=False)
    tc = randomize(Transcoder(cfg))
    with model.saes([tc]):
        model(tokens, stop_at_layer=1)  # reads at blocks.0.hook_resid_post, never reaches the write hook
        with pytest.raises(RuntimeError, match="blocks.1.hook_mlp_out reads at blocks.0.hook_resid_post"):
            # starting at layer 1 skips the read hook: the value captured above must not be used
            model(model.W_E[tokens] + model.W_pos[: tokens.shape[1]], start_at_layer=1)
        out = model(tokens)  # a whole forward captures and writes again
        assert torch.isfinite(out).all()
    assert model.splices == {}
    assert len(model._forward_pre_hooks) == 0


def test_a_transcoder_of_a_plain_architecture_is_not_saved_as_a_plain_sae(tmp_path):
    sae = StandardSAE(SAEConfig("standard", 24, 30, "blocks.0.ln2.hook_normalized",
                                hook_name_out="blocks.0.hook_mlp_out"))
    with pytest.raises(ValueError, match="writes at 'blocks.0.hook_mlp_out'.*transcoder"):
        save_sae(sae, tmp_path / "sae")
    assert not (tmp_path / "sae").exists()


def test_add_sae_reads_the_saes_own_use_error_term_and_refuses_a_non_bool():
    """SAELens's default: add_sae(sae) and saes([sae]) take sae.use_error_term; an explicit argument wins."""
    from glassbox.interp.sae.architectures import make_sae
    from glassbox.interp.sae.config import SAEConfig
    from glassbox.models import Config, HookedTransformer

    torch.manual_seed(0)
    model = HookedTransformer(Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16))
    sae = make_sae(SAEConfig("standard", 24, 11, "blocks.1.hook_resid_pre"))
    toks = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        clean = model(toks)
        sae.use_error_term = True
        with model.saes([sae]):
            assert torch.equal(model(toks), clean)
        model.add_sae(sae)
        assert torch.equal(model(toks), clean)
        model.reset_saes()
        with model.saes([sae], use_error_term=False):
            assert not torch.equal(model(toks), clean)
        sae.use_error_term = "yes"
        with pytest.raises(TypeError, match="use_error_term must be True or False, got 'yes'"):
            model.add_sae(sae)
        assert model.splices == {}
