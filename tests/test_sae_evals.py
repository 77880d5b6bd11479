"""glassbox.interp.sae.evals against hand computations and identities. (Against SAELens's own
run_evals on the same SAE and model: tests_tl/test_sae_evals_saelens.py.)"""

import pytest
import torch
import torch.nn.functional as F

from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.evals import evaluate_sae
from glassbox.models import Config, HookedTransformer

HOOK = "blocks.0.hook_resid_post"
BOS = 49


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50,
                                    n_ctx=16), dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def tokens():
    t = torch.randint(0, BOS, (6, 11), generator=torch.Generator().manual_seed(1))
    t[:, 0] = BOS
    t[2, 5] = BOS  # a special token inside a window is left out too
    return t


def identity_sae(hook=HOOK, reshape="none", dtype=torch.float64):
    """relu(x) - relu(-x) = x: a reconstruction that is exact, bit for bit."""
    sae = StandardSAE(SAEConfig("standard", 24, 48, hook, reshape_activations=reshape), dtype=dtype)
    eye = torch.eye(24, dtype=dtype)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def random_sae(seed=2):
    """A noisy identity: a partial, sparse reconstruction, with two features that never fire."""
    sae = identity_sae()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_enc.add_(torch.randn(24, 48, generator=generator, dtype=torch.float64) * 0.1)
        sae.W_dec.add_(torch.randn(48, 24, generator=generator, dtype=torch.float64) * 0.1)
        sae.b_enc.copy_(-0.02 * torch.rand(48, generator=generator, dtype=torch.float64))
        sae.b_dec.copy_(torch.randn(24, generator=generator, dtype=torch.float64) * 0.02)
        sae.b_enc[[5, 11]] = -100.0
    return sae


def test_an_exact_reconstruction_recovers_everything(model, tokens):
    r = evaluate_sae(model, identity_sae(), tokens, batch_size=4, exclude_special_tokens=[BOS])
    assert r["mse"] == 0.0 and r["explained_variance"] == 1.0
    assert r["ce_loss_with_sae"] == r["ce_loss_without_sae"] and r["ce_loss_score"] == 1.0
    # KL(p || p) as SAELens computes it, p * (log(softmax) - log_softmax): measured 1.6e-18, bound 1e-15
    assert abs(r["kl_div_with_sae"]) <= 1e-15 and abs(r["kl_div_score"] - 1.0) <= 1e-12
    assert r["n_tokens"] == 6 * 11 - 7 and r["n_ce_tokens"] == 6 * 10 - 7  # 7 BOS left out
    assert r["l0"] == 24.0  # relu(x) or relu(-x) is non-zero for every coordinate


def test_a_hook_z_sae_reads_and_writes_the_flattened_heads(model, tokens):
    r = evaluate_sae(model, identity_sae("blocks.1.attn.hook_z", "hook_z"), tokens, exclude_special_tokens=[BOS])
    assert r["mse"] == 0.0 and r["ce_loss_score"] == 1.0 and r["l0"] == 24.0


def test_a_zero_sae_is_the_ablation(model, tokens):
    sae = identity_sae()
    with torch.no_grad():
        sae.W_enc.zero_()
    r = evaluate_sae(model, sae, tokens, exclude_special_tokens=False)
    assert r["ce_loss_with_sae"] == r["ce_loss_with_ablation"] and r["ce_loss_score"] == 0.0
    assert abs(r["kl_div_score"]) <= 1e-12  # the same logits, but KL is not exactly 0 (see above): measured 0
    assert r["l0"] == 0.0 and r["dead_fraction"] == 1.0 and r["n_dead"] == 48
    assert r["n_tokens"] == 66 and r["n_ce_tokens"] == 60


def per_token_loss(logits, tokens):
    log_probs = F.log_softmax(logits[:, :-1], dim=-1)
    return -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]


def test_metrics_by_hand(model, tokens):
    sae = random_sae()
    r = evaluate_sae(model, sae, tokens, batch_size=4, exclude_special_tokens=[BOS], feature_density=True)
    keep = tokens != BOS
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        x = cache[HOOK][keep]
        acts = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        x_hat = acts @ sae.W_dec + sae.b_dec
        mse = (x - x_hat).pow(2).sum(-1).mean()
        centered = (x - x.mean(0)).pow(2).sum(-1).mean()  # the same variance, computed another way
        fired = (acts != 0).sum(0)
        # The spliced run, another way: the glassbox splice with the error term on, its error zeroed
        # at the kept tokens (so they carry the reconstruction) and kept at the BOS (the clean value).
        clean = model(tokens)
        zero_error = lambda error, hook: error * (~keep)[..., None]  # noqa: E731
        with model.saes([sae], use_error_term=True):
            spliced = model.run_with_hooks(tokens, fwd_hooks=[(HOOK + ".hook_sae_error", zero_error)])
        ablated = model.run_with_hooks(tokens, fwd_hooks=[(HOOK, lambda v, hook: v * 0)])
    targets = keep[:, :-1]
    ce = {name: per_token_loss(logits, tokens)[targets].mean().item()
          for name, logits in (("clean", clean), ("sae", spliced), ("ablation", ablated))}
    kl = {name: F.kl_div(F.log_softmax(logits, -1), F.softmax(clean, -1), reduction="none").sum(-1)[keep].mean().item()
          for name, logits in (("sae", spliced), ("ablation", ablated))}
    expected = {"l0": (acts != 0).sum(-1).double().mean().item(), "l1": acts.sum(-1).mean().item(),
                "mse": mse.item(), "explained_variance": 1 - (mse / centered).item(),
                "ce_loss_without_sae": ce["clean"], "ce_loss_with_sae": ce["sae"],
                "ce_loss_with_ablation": ce["ablation"],
                "ce_loss_score": (ce["ablation"] - ce["sae"]) / (ce["ablation"] - ce["clean"]),
                "kl_div_with_sae": kl["sae"], "kl_div_with_ablation": kl["ablation"],
                "kl_div_score": (kl["ablation"] - kl["sae"]) / kl["ablation"]}
    for name, value in expected.items():
        # float64 throughout: measured <= 1.8e-15 (values up to 4), bound 1e-12 (rounding of sums taken
        # in another order, and of E|x|^2 - |E x|^2 against the centred form); l0 is a float32 mean,
        # as SAELens takes it: measured 1.2e-8 (value 3.5), bound 2e-7: 16x
        bound = 2e-7 if name == "l0" else 1e-12
        assert abs(r[name] - value) <= bound, (name, r[name], value)
    assert r["mse"] > 0 and 0.0 < r["l0"] < 24 and r["ce_loss_with_sae"] != r["ce_loss_without_sae"]
    assert r["n_dead"] == int((fired == 0).sum()) >= 2 and r["dead_fraction"] == r["n_dead"] / 48
    assert r["feature_density"] == (fired.double() / keep.sum()).tolist()


def test_batch_size_does_not_change_the_metrics(model, tokens):
    sae = random_sae()
    one = evaluate_sae(model, sae, tokens, batch_size=1, exclude_special_tokens=[BOS])
    all_at_once = evaluate_sae(model, sae, tokens, batch_size=6, exclude_special_tokens=[BOS])
    for name, value in one.items():
        # float64: measured <= 8.9e-16, bound 1e-12
        assert abs(all_at_once[name] - value) <= 1e-12, name


def test_refusals(model, tokens):
    sae = random_sae()
    with pytest.raises(ValueError, match="tokens must be an integer tensor"):
        evaluate_sae(model, sae, tokens[0], exclude_special_tokens=[BOS])
    with pytest.raises(ValueError, match="has none"):
        evaluate_sae(model, sae, tokens)  # no tokenizer to read the special tokens from
    with pytest.raises(ValueError, match="every token of the windows is excluded"):
        evaluate_sae(model, sae, torch.full((2, 4), BOS), exclude_special_tokens=[BOS])
    with pytest.raises(ValueError, match="batch_size"):
        evaluate_sae(model, sae, tokens, batch_size=0, exclude_special_tokens=[BOS])
    transcoder = StandardSAE(SAEConfig("standard", 24, 48, HOOK, hook_name_out="blocks.1.hook_resid_post"))
    with pytest.raises(ValueError, match="a transcoder"):
        evaluate_sae(model, transcoder, tokens, exclude_special_tokens=[BOS])
    other = StandardSAE(SAEConfig("standard", 24, 48, "blocks.7.hook_resid_post"))
    with pytest.raises(KeyError, match="blocks.7.hook_resid_post"):
        evaluate_sae(model, other, tokens, exclude_special_tokens=[BOS])
