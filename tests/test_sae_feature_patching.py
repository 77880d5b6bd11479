"""Feature patching (glassbox.interp.sae.feature_patching) equals a one-patch-per-forward loop.

Oracle: for each (position, feature), one full forward of the spliced model under run_with_hooks with
a hook on ``<hook>.hook_sae_acts_post`` setting that one activation, and the metric of its logits.
"""

import pytest
import torch

from glassbox.interp.patching import LogitDiff, TargetLoss, VariantMetric
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.feature_patching import feature_ablate, feature_patch
from glassbox.models import Config, HookedTransformer

CFG = Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16, init_range=0.2)
D_SAE = 13
FEATURES = [0, 3, 5, 11]
PLACES = {
    "resid_pre": ("blocks.1.hook_resid_pre", None, 24, "none"),
    "hook_z": ("blocks.0.attn.hook_z", None, 24, "hook_z"),
    "transcoder": ("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", 24, "none"),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, CFG.d_vocab, (2, 5), generator=g)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(0, CFG.d_vocab, (2,), generator=g)
    return clean, corrupted


def make_sae(place: str, seed: int = 0) -> StandardSAE:
    read, write, d_in, reshape = PLACES[place]
    sae = StandardSAE(SAEConfig("standard", d_in, D_SAE, read, hook_name_out=write, reshape_activations=reshape))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec):
            p.copy_(3 * torch.randn(p.shape, generator=g) / d_in ** 0.5)
        sae.b_enc.copy_(0.3 * torch.randn(sae.b_enc.shape, generator=g))
    return sae


def loop(model, tokens, metric, name, features, positions, value_at, reduce=True, fwd_hooks=()) -> torch.Tensor:
    """[pos feature] (or [feature] with positions=None): one forward per variant."""
    out = []
    for p in positions if positions is not None else [None]:
        row = []
        for f in features:
            def set_one(act, hook, p=p, f=f):
                act = act.clone()
                where = slice(None) if p is None else p
                act[:, where, f] = value_at(act)[:, where, f]
                return act

            with torch.no_grad():
                logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + [(name, set_one)])
            v = metric(logits)
            row.append(v.mean() if reduce else v)
        out.append(torch.stack(row))
    out = torch.stack(out)
    return out if positions is not None else out[0]


def test_feature_patch_equals_the_loop(model, prompts):
    clean, corrupted = prompts
    metric = LogitDiff(torch.tensor([3, 4]), torch.tensor([6, 7]))
    sae = make_sae("resid_pre")
    name = "blocks.1.hook_resid_pre.hook_sae_acts_post"
    with model.saes([sae], use_error_term=True):
        _, clean_cache = model.run_with_cache(clean)
        # a budget of about 6 variants a pass, and 3 bands by first position (those from position p on compute
        # positions p: only, from the corrupted run's keys and values before p)
        result = feature_patch(model, corrupted, clean_cache, metric, sae, features=FEATURES, memory_budget=2**17,
                               bands=3)
        expected = loop(model, corrupted, metric, name, FEATURES, range(5), lambda act: clean_cache[name])
        whole = feature_patch(model, corrupted, clean_cache, metric, sae, ("feature",), features=FEATURES)
        expected_whole = loop(model, corrupted, metric, name, FEATURES, None, lambda act: clean_cache[name])
    assert result.axes == ("pos", "feature") and result.shape == (5, 4)
    assert result.labels["feature"] == ["0", "3", "5", "11"] and len(result.labels["pos"]) == 5
    assert whole.axes == ("feature",) and whole.shape == (4,)
    assert expected.abs().max() > 0.1 and expected_whole.abs().max() > 0.1  # patches move the metric
    # measured 2.4e-7 (values up to 1.2), bound 2.5e-6: 10x
    torch.testing.assert_close(result.values, expected, rtol=0, atol=2.5e-6)
    # measured 4.8e-7 (values up to 1.2), bound 5e-6: 10x
    torch.testing.assert_close(whole.values, expected_whole, rtol=0, atol=5e-6)


def test_every_feature_by_default(model, prompts):
    clean, corrupted = prompts
    metric = LogitDiff(torch.tensor([3, 4]), torch.tensor([6, 7]))
    sae = make_sae("transcoder", 2)
    name = "blocks.0.hook_mlp_out.hook_sae_acts_post"
    with model.saes([sae], use_error_term=True):
        _, clean_cache = model.run_with_cache(clean)
        result = feature_patch(model, corrupted, clean_cache, metric, sae, ("feature",))
        expected = loop(model, corrupted, metric, name, range(D_SAE), None, lambda act: clean_cache[name])
    assert result.shape == (D_SAE,)
    # measured 1.1e-6 (values up to 1.5), bound 1.2e-5: 11x
    torch.testing.assert_close(result.values, expected, rtol=0, atol=1.2e-5)


@pytest.mark.parametrize("value", ["zero", "mean", "tensor"])
def test_feature_ablate_equals_the_loop(model, prompts, value):
    _, tokens = prompts
    sae = make_sae("hook_z", 3)
    name = "blocks.0.attn.hook_z.hook_sae_acts_post"
    metric = TargetLoss(torch.tensor([9, 2]))
    with model.saes([sae], use_error_term=True):
        acts = model.run_with_cache(tokens)[1][name]
        given = {"zero": torch.zeros(D_SAE), "mean": acts.mean((0, 1)),
                 "tensor": torch.linspace(-1, 2, D_SAE)}[value]
        axes = ("pos", "feature") if value == "zero" else ("feature",)
        result = feature_ablate(model, tokens, metric, sae, axes, value=given if value == "tensor" else value,
                                features=FEATURES, reduce=None, memory_budget=2**17)
        expected = loop(model, tokens, metric, name, FEATURES, range(5) if value == "zero" else None,
                        lambda act: given.expand_as(act), reduce=False)
    assert result.axes == axes + ("batch",) and result.shape == expected.shape == ((5,) if value == "zero" else ()) + (4, 2)
    assert (expected - metric(model(tokens))).abs().max() > 1e-2
    # measured 9.5e-7 (values up to 5.4), bound 1e-5: 10x
    torch.testing.assert_close(result.values, expected, rtol=0, atol=1e-5)


def test_user_hooks_and_full_logit_metrics_are_honoured(model, prompts):
    """A user hook (halving the residual stream entering block 1) and a metric of whole logits."""
    clean, corrupted = prompts
    sae = make_sae("transcoder", 4)
    name = "blocks.0.hook_mlp_out.hook_sae_acts_post"
    user = [("blocks.1.hook_resid_pre", lambda act, hook: act * 0.5)]
    metric = VariantMetric(lambda logits: logits[:, -1, 3].mean() - logits[:, 2, 5].mean())
    with model.saes([sae]):  # error term off
        _, clean_cache = model.run_with_cache(clean)
        result = feature_patch(model, corrupted, clean_cache, metric, sae, features=[1, 2], fwd_hooks=user)
        expected = loop(model, corrupted, lambda logits: metric.fn(logits), name, [1, 2], range(5),
                        lambda act: clean_cache[name], fwd_hooks=user)
    assert not model.has_hooks and model.splices == {}
    # measured 2.4e-7 (values up to 1.9), bound 3e-6: 12x
    torch.testing.assert_close(result.values, expected, rtol=0, atol=3e-6)


def test_refusals(model, prompts):
    clean, corrupted = prompts
    metric = LogitDiff(3, 6)
    sae = make_sae("resid_pre")
    with pytest.raises(ValueError, match="is not spliced into the model"):
        feature_ablate(model, corrupted, metric, sae)
    with model.saes([sae]):
        _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_resid_post"))
        with pytest.raises(KeyError, match="blocks.1.hook_resid_pre.hook_sae_acts_post"):
            feature_patch(model, corrupted, cache, metric, sae)
        with pytest.raises(ValueError, match="axes are"):
            feature_ablate(model, corrupted, metric, sae, ("feature", "pos"))
        with pytest.raises(ValueError, match="d_sae=13"):
            feature_ablate(model, corrupted, metric, sae, features=[13])
        with pytest.raises(ValueError, match="distinct"):
            feature_ablate(model, corrupted, metric, sae, features=[1, 1])
        with pytest.raises(ValueError, match="one value per feature \\[13\\]"):
            feature_ablate(model, corrupted, metric, sae, value=torch.zeros(4))
        with pytest.raises(ValueError, match="'zero', 'mean'"):
            feature_ablate(model, corrupted, metric, sae, value="half")
    assert model.splices == {} and not model.has_hooks


def test_mean_ablation_averages_the_unpadded_positions(model, prompts):
    _, tokens = prompts
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, 3:] = False  # the second prompt is 3 tokens long, right-padded
    sae = make_sae("resid_pre", 6)
    name = "blocks.1.hook_resid_pre.hook_sae_acts_post"
    metric = LogitDiff(torch.tensor([3, 4]), torch.tensor([6, 7]), pos=torch.tensor([4, 2]))
    with model.saes([sae], use_error_term=True):
        acts = model.run_with_cache(tokens, attention_mask=mask)[1][name]
        by_hand = torch.cat([acts[0], acts[1, :3]]).mean(0)  # 8 real positions
        mean = feature_ablate(model, tokens, metric, sae, ("feature",), value="mean", attention_mask=mask)
        given = feature_ablate(model, tokens, metric, sae, ("feature",), value=by_hand, attention_mask=mask)
    assert (by_hand - acts.mean((0, 1))).abs().max() > 1e-3  # the padding would move a plain mean
    # measured 3.6e-7 (values up to 2.2; the two means round differently), bound 5e-6: 14x
    torch.testing.assert_close(mean.values, given.values, rtol=0, atol=5e-6)
