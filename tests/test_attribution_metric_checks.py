"""Every gradient method (AtP, AtP* with and without GradDrop, AtP over an SAE's features, EAP, EAP-IG
over the inputs and over the activations), and the exact circuit evaluators beside them, refuse a metric it cannot differentiate, naming the metric,
instead of returning NaN scores, all-zero scores or autograd's message; and refuses inputs of
mismatched shapes by name. After each refusal the model has no hooks, no SAE left over from the run,
and its flags as before.

Oracle: each bad metric below is bad by construction (NaN, inf, a non-scalar, an int, a detached tensor,
a float, a value that does not read the logits, a finite value whose gradient is NaN); the good metric
on the same call runs, so each refusal is the metric's.
"""

import pytest
import torch

from glassbox.interp.attribution import (attribution_patch, attribution_patch_star, eap, evaluate_circuit,
                                         faithfulness_curve, prune_circuit)
from glassbox.interp.patching import LogitDiff
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.models import Config, HookedTransformer

CFG = Config(d_model=20, n_layers=2, n_heads=3, d_head=5, d_mlp=13, d_vocab=23, n_ctx=11, init_range=0.3)
N, SEQ = 2, 6
GOOD = LogitDiff(torch.tensor([3, 17]), torch.tensor([9, 8]))
FEATURE_HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG).eval()


def tokens():
    g = torch.Generator().manual_seed(4)
    return torch.randint(0, CFG.d_vocab, (N, SEQ), generator=g), torch.randint(0, CFG.d_vocab, (N, SEQ), generator=g)


def with_sae(model, fn):
    sae = StandardSAE(SAEConfig("standard", d_in=CFG.d_model, d_sae=7, hook_name=FEATURE_HOOK))
    sae.initialize()
    with torch.no_grad():
        sae.b_enc.fill_(0.3)
    model.add_sae(sae, use_error_term=True)
    try:
        return fn()
    finally:
        model.reset_saes()


METHODS = {
    "atp": lambda m, c, x, metric: attribution_patch(m, c, x, metric, "z", ("layer", "head")),
    "atp*": lambda m, c, x, metric: attribution_patch_star(m, c, x, metric, "k", ("layer", "head")),
    "atp*-qk-only": lambda m, c, x, metric: attribution_patch(m, c, x, metric, "q", ("layer", "pos"), method="atp*",
                                                              grad_drop=False),
    "feature-atp": lambda m, c, x, metric: with_sae(m, lambda: attribution_patch(
        m, c, x, metric, f"{FEATURE_HOOK}.hook_sae_acts_post", ("pos", "feature"), hook_axes=("pos", "feature"))),
    "EAP": lambda m, c, x, metric: eap(m, c, x, metric),
    "EAP-IG-inputs": lambda m, c, x, metric: eap(m, c, x, metric, method="EAP-IG-inputs", steps=3),
    "EAP-IG-activations": lambda m, c, x, metric: eap(m, c, x, metric, method="EAP-IG-activations", steps=2),
}


# Each bad metric, by name (the name must appear in the refusal), with the error and what else it must say.
def nan_metric(logits):
    return logits[:, -1, 0] * float("nan")


def inf_metric(logits):
    return logits[:, -1, 0] + float("inf")


def one_nan_row(logits):
    out = logits[:, -1, 0] - logits[:, -1, 1]
    return torch.where(torch.arange(len(out)) == 1, torch.full_like(out, float("nan")), out)


def non_scalar_metric(logits):
    return logits[:, -1, :2]


def int_metric(logits):
    return logits[:, -1].argmax(-1)


def detached_metric(logits):
    return GOOD(logits).detach()


def float_metric(logits):
    return float(GOOD(logits)[0])


def unread_logits(logits):
    return torch.ones(logits.shape[0], requires_grad=True) * 2.0


def nan_gradient(logits):
    x = logits[:, -1, 0] - logits[:, -1, 0]  # 0, with a gradient that sqrt makes inf - inf = NaN
    return torch.sqrt(x)


BAD = [
    (nan_metric, ValueError, "NaN"),
    (inf_metric, ValueError, "inf"),
    (one_nan_row, ValueError, "prompt 1"),
    (non_scalar_metric, ValueError, "(2, 2)"),
    (int_metric, TypeError, "int64"),
    (detached_metric, ValueError, "no gradient"),
    (float_metric, TypeError, "float"),
    (unread_logits, ValueError, "logits"),
    (nan_gradient, ValueError, "gradient"),
]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("metric, error, says", BAD, ids=[m.__name__ for m, _, _ in BAD])
def test_bad_metric_refused_naming_it(model, method, metric, error, says):
    clean, corrupted = tokens()
    before = model.hook_flags.as_dict()
    with pytest.raises(error) as info:
        METHODS[method](model, clean, corrupted, metric)
    message = str(info.value)
    assert metric.__name__ in message and says in message, message
    assert "element 0 of tensors" not in message  # not autograd's message
    assert model.hook_flags.as_dict() == before and not model.has_hooks and not getattr(model, "splices", {})


@pytest.mark.parametrize("method", list(METHODS))
def test_the_good_metric_runs_on_the_same_calls(model, method):
    result = METHODS[method](model, *tokens(), GOOD)
    values = result.scores[result.edge_mask()] if hasattr(result, "scores") else result.values
    assert torch.isfinite(values).all() and values.abs().max() > 0


@pytest.mark.parametrize("method", list(METHODS))
def test_mismatched_inputs_refused_by_name(model, method):
    clean, corrupted = tokens()
    cases = [
        ((clean, corrupted[:, :-1]), "corrupted"),      # another length
        ((clean[:1], corrupted), "clean"),               # another number of prompts
    ]
    for (c, x), named in cases:
        with pytest.raises(ValueError) as info:
            METHODS[method](model, c, x, GOOD)
        message = str(info.value)
        assert named in message and "shape" in message, message
    bad = clean.clone()
    bad[0, 2] = CFG.d_vocab  # one past the vocabulary
    with pytest.raises(ValueError) as info:
        METHODS[method](model, bad, corrupted, GOOD)
    assert str(CFG.d_vocab) in str(info.value) and "clean" in str(info.value), str(info.value)
    assert not model.has_hooks


def test_eap_mask_and_empty_batch_refused_by_name(model):
    clean, corrupted = tokens()
    with pytest.raises(ValueError, match="attention_mask"):
        eap(model, clean, corrupted, GOOD, attention_mask=torch.ones(N, SEQ - 1))
    with pytest.raises(ValueError, match="clean_tokens"):
        eap(model, clean[:0], corrupted[:0], GOOD)


# --- the exact evaluators (no gradient, same metrics): a NaN or non-float metric is refused by name -----
EXACT = {
    "evaluate_circuit": lambda m, c, x, metric: evaluate_circuit(m, c, x, metric, eap(m, c, x, GOOD).top_k(5)),
    "faithfulness_curve": lambda m, c, x, metric: faithfulness_curve(m, eap(m, c, x, GOOD), c, x, metric,
                                                                     sizes=[0, 3, 10]),
    "prune_circuit": lambda m, c, x, metric: prune_circuit(m, c, x, metric, threshold=0.05),
}


@pytest.mark.parametrize("method", list(EXACT))
@pytest.mark.parametrize("metric, error, says", [(nan_metric, ValueError, "nan"), (one_nan_row, ValueError, "prompt 1"),
                                                 (int_metric, TypeError, "int64"), (float_metric, TypeError, "float")],
                         ids=["nan", "one_nan_row", "int", "float"])
def test_exact_evaluators_refuse_a_bad_metric_by_name(model, method, metric, error, says):
    with pytest.raises(error) as info:
        EXACT[method](model, *tokens(), metric)
    assert metric.__name__ in str(info.value) and says in str(info.value), str(info.value)
    assert not model.has_hooks


def test_atp_refuses_caches_holding_nan_by_hook_name(model):
    clean, corrupted = tokens()
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(CFG.n_layers)]
    with torch.no_grad():
        _, c_cache = model.run_with_cache(clean, names_filter=names)
        _, x_cache = model.run_with_cache(corrupted, names_filter=names)
    bad = {n: v.clone() for n, v in c_cache.items()}
    bad["blocks.1.attn.hook_z"][0, 2, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"clean blocks\.1\.attn\.hook_z .*not finite"):
        attribution_patch(model, clean, corrupted, GOOD, "z", ("layer", "head"), clean_cache=bad)
    bad = {n: v.clone() for n, v in x_cache.items()}
    bad["blocks.0.attn.hook_z"][1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"corrupted cache blocks\.0\.attn\.hook_z"):
        attribution_patch(model, clean, corrupted, GOOD, "z", ("layer", "head"), corrupted_cache=bad)
    # the good caches give the estimate without them (measured 0: the same values)
    with_caches = attribution_patch(model, clean, corrupted, GOOD, "z", ("layer", "head"), clean_cache=c_cache,
                                    corrupted_cache=x_cache)
    without = attribution_patch(model, clean, corrupted, GOOD, "z", ("layer", "head"))
    assert torch.equal(with_caches.values, without.values)
    assert not model.has_hooks
