"""hook_z SAEs through every glassbox path: decode's [... head d_head] (SAELens's shape; the values
against SAELens are in tests_tl/test_sae_hook_z_saelens.py), the splice, evaluate_sae against a hand
computation, and train_sae at an attention hook_z (whose stream rows are flattened)."""

import pytest
import torch

from glassbox.interp.sae.architectures import make_sae
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.evals import evaluate_sae
from glassbox.models import Config, HookedTransformer
from glassbox.train.sae import train_sae

HOOK_Z = "blocks.1.attn.hook_z"
N_HEADS, D_HEAD, D_SAE = 3, 8, 29


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(n_layers=2, d_model=24, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=40, d_vocab=50,
                                    n_ctx=16)).eval()


def hook_z_sae(seed=0):
    sae = make_sae(SAEConfig("standard", N_HEADS * D_HEAD, D_SAE, HOOK_Z, reshape_activations="hook_z"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return sae


def test_decode_unflattens_the_heads_and_the_splice_writes_forward(model):
    sae = hook_z_sae()
    toks = torch.randint(1, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        z = model.run_with_cache(toks, names_filter=[HOOK_Z])[1][HOOK_Z]
        recons = sae.decode(sae.encode(z))
        assert recons.shape == z.shape == (2, 7, N_HEADS, D_HEAD) and sae.d_head == D_HEAD
        # by hand: flatten head-major, ReLU SAE, unflatten
        flat = z.reshape(2, 7, -1)
        want = (torch.relu((flat - sae.b_dec) @ sae.W_enc + sae.b_enc) @ sae.W_dec + sae.b_dec).reshape(z.shape)
        assert torch.equal(recons, want)
        with model.saes([sae]):
            _, cache = model.run_with_cache(toks, names_filter=[f"{HOOK_Z}.hook_sae_output",
                                                                 f"{HOOK_Z}.hook_sae_recons"])
        assert torch.equal(cache[f"{HOOK_Z}.hook_sae_output"], want)
        assert cache[f"{HOOK_Z}.hook_sae_recons"].shape == (2, 7, N_HEADS * D_HEAD)  # SAELens's: flattened


def test_evaluate_sae_at_hook_z_is_the_hand_computation(model):
    sae = hook_z_sae(2)
    toks = torch.randint(1, 50, (3, 9), generator=torch.Generator().manual_seed(3))
    toks[:, 0] = 0
    got = evaluate_sae(model, sae, toks, exclude_special_tokens=[0], compute_ce_loss=False)
    with torch.no_grad():
        z = model.run_with_cache(toks, names_filter=[HOOK_Z])[1][HOOK_Z][:, 1:].reshape(-1, N_HEADS * D_HEAD)
        acts = torch.relu((z - sae.b_dec) @ sae.W_enc + sae.b_enc)
        recons = acts @ sae.W_dec + sae.b_dec
    mse = float((z - recons).double().pow(2).sum(-1).mean())
    assert got["n_tokens"] == 3 * 8
    assert got["l0"] == pytest.approx(float((acts != 0).sum(-1).float().mean()), rel=0, abs=1e-6)
    assert got["mse"] == pytest.approx(mse, rel=1e-6)  # the same float32 products: measured rel 0


def test_train_sae_at_hook_z(model):
    stream = torch.randint(1, 50, (4000,), generator=torch.Generator().manual_seed(4))
    sae = train_sae(model, stream, HOOK_Z, d_sae=D_SAE, k=4, steps=3, batch_tokens=64, context_size=16,
                    buffer_batches=2, model_batch=2, bos_id=0, progress=False)
    assert sae.cfg.reshape_activations == "hook_z" and sae.cfg.d_in == N_HEADS * D_HEAD
    z = torch.randn(5, N_HEADS, D_HEAD)
    with torch.no_grad():
        acts = sae.encode(z)
        assert acts.shape == (5, D_SAE) and int((acts != 0).sum(-1).max()) <= 4
        assert sae.decode(acts).shape == z.shape

