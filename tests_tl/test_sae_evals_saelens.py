"""SAE evals and training losses against SAELens 6.54.12 on the same weights.

Evals: glassbox's ``evaluate_sae`` on glassbox-austen against SAELens's ``run_evals`` on the
TransformerLens twin of the same model (``tl_twin``) with a SAELens SAE holding the same weights,
over the same held-out windows (the end of Sense and Sensibility), special tokens excluded on both
sides. The SAEs are trained briefly by glassbox's trainer, so their metrics are those of a real SAE.

Training losses: ``training_step_losses`` against SAELens's ``TrainingSAE.training_forward_pass``
(TopK with decoder-norm rescaling and AuxK; ReLU with the decoder-norm-weighted L1), losses,
activations, reconstructions and the gradients of the total loss.
"""

from pathlib import Path

import pytest
import torch
from tl_oracle import tl_twin

from glassbox.interp.sae.evals import evaluate_sae
from glassbox.models import HookedTransformer
from glassbox.train.data import encode_text
from glassbox.train.sae import train_sae, training_step_losses
from glassbox.train.sae.trainer import initialize, sae_class, SAETrainConfig

from sae_lens import StandardSAE as SLStandardSAE
from sae_lens import StandardSAEConfig, TopKSAEConfig
from sae_lens import StandardTrainingSAE, StandardTrainingSAEConfig, TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens import TopKSAE as SLTopKSAE
from sae_lens.evals import EvalConfig, run_evals
from sae_lens.saes.sae import SAEMetadata, TrainStepInput
from sae_lens.training.activation_scaler import ActivationScaler

ROOT = Path(__file__).resolve().parent.parent
HOOK = "blocks.0.hook_resid_post"
CONTEXT, N_WINDOWS, BATCH = 64, 24, 6


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen").eval()


@pytest.fixture(scope="module")
def windows(model):
    stream = encode_text((ROOT / "tests_tl" / "data" / "austen_tail.txt").read_text(encoding="utf-8"), model.tokenizer)
    body = stream[:N_WINDOWS * (CONTEXT - 1)].reshape(N_WINDOWS, CONTEXT - 1)
    return torch.cat([torch.full((N_WINDOWS, 1), model.tokenizer.bos_token_id), body], dim=1)


@pytest.fixture(scope="module")
def trained(model):
    text = (ROOT / "data" / "austen.txt").read_text(encoding="utf-8")[:120_000]
    common = dict(steps=25, batch_tokens=512, lr=2e-3, seed=3, context_size=CONTEXT, buffer_batches=4,
                  model_batch=8, progress=False)
    return {"topk": train_sae(model, text, HOOK, 160, architecture="topk", k=12, **common),
            "standard": train_sae(model, text, HOOK, 160, architecture="standard", l1_coefficient=0.3,
                                  dead_feature_window=5, feature_sampling_window=0, **common)}


class Store:
    """The part of SAELens's ActivationsStore that run_evals reads: fixed windows, in order."""

    def __init__(self, tokens):
        self.tokens, self.at = tokens, 0
        self.context_size, self.store_batch_size_prompts = tokens.shape[1], BATCH

    def get_batch_tokens(self, n):
        batch = self.tokens[self.at:self.at + n]
        self.at += n
        return batch

    def reset_input_dataset(self):
        self.at = 0


def saelens_twin(sae):
    meta = SAEMetadata(hook_name=HOOK)
    if sae.cfg.architecture == "topk":
        sl = SLTopKSAE(TopKSAEConfig(d_in=sae.cfg.d_in, d_sae=sae.cfg.d_sae, k=sae.cfg.k, metadata=meta))
    else:
        sl = SLStandardSAE(StandardSAEConfig(d_in=sae.cfg.d_in, d_sae=sae.cfg.d_sae, metadata=meta))
    sl.load_state_dict({name: p.detach().clone() for name, p in sae.named_parameters()}, strict=True)
    return sl.eval()


@pytest.fixture(scope="module")
def results(model, windows, trained):
    twin = tl_twin(model)
    out = {}
    for name, sae in trained.items():
        ours = evaluate_sae(model, sae, windows, batch_size=BATCH)
        config = EvalConfig(batch_size_prompts=BATCH, n_eval_reconstruction_batches=N_WINDOWS // BATCH,
                            n_eval_sparsity_variance_batches=N_WINDOWS // BATCH, compute_kl=True, compute_ce_loss=True,
                            compute_sparsity_metrics=True, compute_variance_metrics=True,
                            compute_featurewise_density_statistics=True)
        metrics, features = run_evals(saelens_twin(sae), Store(windows), twin, ActivationScaler(), config,
                                      exclude_special_tokens=True)
        flat = {k: v for group in metrics.values() for k, v in group.items()}
        density = torch.tensor(features["feature_density"])
        flat["n_dead"] = int((density == 0).sum())
        out[name] = (ours, flat)
    return out


# Each metric's bound, two-sided, from the errors measured on both SAEs (glassbox and
# TransformerLens agree on this model's activations to ~1e-6 of their size; the rest is the order of
# float32 sums).
BOUNDS = {
    # measured 0 (topk: exactly 12; standard: 96.17), bound 0: the same features fire
    "l0": 0.0,
    # measured 1.4e-6 (values ~8-11), bound 2e-5: 14x
    "l1": 2e-5,
    # measured 3.8e-6 (values ~23-24), bound 5e-5: 13x
    "mse": 5e-5,
    # measured 1.3e-9, bound 2e-8: 16x
    "explained_variance": 2e-8,
    # measured 0 (values 3.8-7.4: TransformerLens and glassbox give the same float32 losses here),
    # bound 1e-5: a few float32 ulps of the values, for machines whose kernels round otherwise
    "ce_loss_without_sae": 1e-5, "ce_loss_with_sae": 1e-5, "ce_loss_with_ablation": 1e-5,
    # measured 0, bound 2e-6: the CE bounds above carried through the ratio
    "ce_loss_score": 2e-6,
    # measured 2.4e-7 (values ~2.3-3.8), bound 3e-6: 12x
    "kl_div_with_sae": 3e-6, "kl_div_with_ablation": 3e-6,
    # measured 4.1e-8, bound 5e-7: 12x
    "kl_div_score": 5e-7,
    # measured 0 (topk: 4 dead), bound 0: features that fire on none of the same tokens
    "n_dead": 0,
}


@pytest.mark.parametrize("architecture", ["topk", "standard"])
@pytest.mark.parametrize("metric", sorted(BOUNDS))
def test_evals_equal_saelens(results, architecture, metric):
    ours, theirs = results[architecture]
    error = abs(ours[metric] - theirs[metric])
    print(f"{architecture} {metric}: glassbox {ours[metric]:.8g} SAELens {theirs[metric]:.8g} |diff| {error:.3g}")
    assert error <= BOUNDS[metric], (architecture, metric, ours[metric], theirs[metric])


def test_the_metrics_are_those_of_real_saes(results):
    """Guards the comparison from being vacuous: both SAEs reconstruct, the ablation hurts, L0 is sparse."""
    for name, (ours, _) in results.items():
        assert 0.3 < ours["explained_variance"] < 1.0, name
        assert 0.0 < ours["ce_loss_score"] < 1.0, name
        assert ours["ce_loss_with_ablation"] > ours["ce_loss_with_sae"] > ours["ce_loss_without_sae"], name
        assert 0 < ours["l0"] < 160, name
    assert results["topk"][0]["l0"] == 12.0
    assert results["topk"][0]["n_dead"] > 0  # the dead-feature comparison counts something


# -- training losses -------------------------------------------------------------------------------
def glassbox_training_sae(architecture, d_in=24, d_sae=37, k=5, seed=0):
    config = SAETrainConfig(hook_name=HOOK, d_sae=d_sae, context_size=8, architecture=architecture,
                            k=k if architecture == "topk" else None, seed=seed)
    from glassbox.interp.sae.config import SAEConfig

    sae = sae_class(architecture)(SAEConfig(architecture, d_in, d_sae, HOOK, k=config.k))
    initialize(sae, config)
    generator = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():  # drift the decoder norms and biases away from their initial values
        sae.W_dec.mul_(torch.rand(d_sae, 1, generator=generator) * 3 + 0.5)
        sae.W_enc.add_(0.05 * torch.randn(sae.W_enc.shape, generator=generator))
        sae.b_enc.copy_(0.1 * torch.randn(d_sae, generator=generator))
        sae.b_dec.copy_(0.1 * torch.randn(d_in, generator=generator))
    return sae


def saelens_training_twin(sae):
    cfg = sae.cfg
    if cfg.architecture == "topk":
        sl = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=cfg.d_in, d_sae=cfg.d_sae, k=cfg.k,
                                                   rescale_acts_by_decoder_norm=True, aux_loss_coefficient=1.0))
    else:
        sl = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=cfg.d_in, d_sae=cfg.d_sae))
    sl.load_state_dict({name: p.detach().clone() for name, p in sae.named_parameters()}, strict=True)
    return sl


@pytest.mark.parametrize("architecture,n_dead", [("topk", 0), ("topk", 4), ("topk", 30), ("standard", 0)])
def test_training_losses_and_gradients_equal_saelens(architecture, n_dead):
    sae = glassbox_training_sae(architecture)
    sl = saelens_training_twin(sae)
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(29, 24, generator=generator) * 2 + 0.3
    dead = torch.zeros(37, dtype=torch.bool)
    dead[torch.randperm(37, generator=generator)[:n_dead]] = True
    l1 = 0.7
    ours = training_step_losses(sae, x, dead, l1_coefficient=l1, aux_coefficient=1.0)
    theirs = sl.training_forward_pass(TrainStepInput(sae_in=x, coefficients={"l1": l1}, dead_neuron_mask=dead,
                                                     n_training_steps=0, is_logging_step=False))
    # measured 6.0e-8 (values up to 0.5), bound 1e-6: 17x
    torch.testing.assert_close(ours["sae_out"], theirs.sae_out, atol=1e-6, rtol=0)
    # measured 0 (values up to 2.0), bound 1e-6: float32 ulps, for kernels that round otherwise
    torch.testing.assert_close(ours["feature_acts"], theirs.feature_acts, atol=1e-6, rtol=0)
    assert torch.equal(ours["feature_acts"] != 0, theirs.feature_acts != 0)
    their_penalty = theirs.losses["auxiliary_reconstruction_loss" if architecture == "topk" else "l1_loss"]
    our_penalty = ours["aux_loss" if architecture == "topk" else "l1_loss"]
    if architecture == "topk" and n_dead == 0:
        assert our_penalty.item() == 0.0 and their_penalty.item() == 0.0
    # measured 0 relative (values 1.3-92), bound 1e-6 relative: a few float32 ulps
    torch.testing.assert_close(our_penalty, their_penalty, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours["mse_loss"], theirs.losses["mse_loss"], rtol=1e-6, atol=0)
    ours["loss"].backward()
    theirs.loss.backward()
    for name, param in sae.named_parameters():
        grad, their_grad = param.grad, getattr(sl, name).grad
        scale = their_grad.abs().max().item()
        # measured <= 9.9e-8 of the largest entry, bound 1e-6 of it: 10x
        torch.testing.assert_close(grad, their_grad, atol=1e-6 * scale, rtol=0, msg=f"{architecture} {name}")
