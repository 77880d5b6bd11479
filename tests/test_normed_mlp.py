"""The MLP with a norm after its activation (Config.mlp_ln, TransformerLens's SoLU MLP) and the "solu"
activation: a hand computation in float64, the hooks' identities, weight processing that must keep
the log-probs, and the Config's refusals. Distinct sizes (d_model 10, 2 heads of 5, d_mlp 14) so a
swapped axis fails. TransformerLens's own SoLU model is the oracle in
tests_tl/test_own_format_models_tl.py."""

import pytest
import torch

from glassbox.models import Config, HookedTransformer, NormedMLP
from glassbox.models.activations import ALL_ACTIVATIONS, solu
from glassbox.weights.processing import process

SIZES = dict(d_model=10, n_layers=2, n_heads=2, d_vocab=23, n_ctx=13, d_mlp=14)


def seeded(seed: int = 0, dtype=torch.float64, **fields) -> HookedTransformer:
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**SIZES, act_fn="solu", mlp_ln=True, init_range=0.3, **fields), dtype=dtype)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # norms and biases away from 1 and 0, so folding them is not a no-op
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.add_(0.3 * torch.randn(param.shape, generator=generator, dtype=dtype))
            elif name.rsplit(".", 1)[-1].startswith("b"):
                param.copy_(0.3 * torch.randn(param.shape, generator=generator, dtype=dtype))
    return model.eval()


def test_solu_is_x_times_softmax_by_hand():
    x = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    e = torch.exp(x)
    # by hand: x_i e^{x_i} / sum_j e^{x_j}
    torch.testing.assert_close(solu(x), x * e / e.sum(), atol=1e-15, rtol=0)
    assert ALL_ACTIVATIONS["solu"] is solu


def test_normed_mlp_by_hand_and_its_hooks():
    model = seeded(0)
    mlp = model.blocks[1].mlp
    assert isinstance(mlp, NormedMLP) and tuple(mlp.ln.w.shape) == (14,) and tuple(mlp.ln.b.shape) == (14,)
    x = torch.randn(3, 7, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        pre = x @ mlp.W_in + mlp.b_in
        mid = pre * torch.softmax(pre, -1)
        centred = mid - mid.mean(-1, keepdim=True)
        post = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + 1e-5) * mlp.ln.w + mlp.ln.b
        # measured 6.7e-16 (outputs up to 2.0), bound 1e-12
        torch.testing.assert_close(mlp(x), post @ mlp.W_out + mlp.b_out, atol=1e-12, rtol=0)
    toks = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(3))
    _, cache = model.run_with_cache(toks)
    for L in range(2):
        p = f"blocks.{L}.mlp."
        assert torch.equal(cache[p + "hook_mid"], solu(cache[p + "hook_pre"]))
        assert torch.equal(cache[p + "hook_post"], cache[p + "ln.hook_out"])
        assert tuple(cache[p + "ln.hook_scale"].shape) == (2, 9, 1)
        assert tuple(cache[p + "ln.hook_normalized"].shape) == (2, 9, 14)


def test_processing_keeps_the_log_probs_and_folds_the_mlp_norm():
    model = seeded(4)
    toks = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(5))
    folded = process(model, fold_ln=True, center_reader_weights=True, center_writing_weights=True,
                     center_unembed=True, fold_value_biases=True)
    for L in range(2):
        ln = folded.blocks[L].mlp.ln
        assert bool((ln.w == 1).all()) and not ln.b.any(), f"blocks.{L}.mlp.ln was not folded"
        # W_out reads a zero-mean vector over d_mlp: its mean over d_mlp was removed
        assert float(folded.blocks[L].mlp.W_out.mean(0).abs().max()) < 1e-14  # measured 1.5e-17
    with torch.no_grad():
        before = model(toks).log_softmax(-1)
        after = folded(toks).log_softmax(-1)
    # measured 2.7e-15 (log-probs down to -6.2), bound 1e-12
    torch.testing.assert_close(after, before, atol=1e-12, rtol=0)
    # folding ln2 only (not mlp.ln) would change the outputs: the check above can fail
    assert float((model.blocks[0].mlp.ln.w - 1).abs().max()) > 0.1


@pytest.mark.parametrize("fields,named", [
    (dict(gated_mlp=True, act_fn="silu"), "gated_mlp"),
    (dict(attn_only=True), "attn_only"),
])
def test_config_refuses_mlp_ln_where_it_has_no_meaning(fields, named):
    options = {**SIZES, "mlp_ln": True, **fields}
    with pytest.raises(ValueError, match=named):
        Config(**options)


def test_rms_models_get_an_rms_mlp_norm():
    from glassbox.models import RMSNorm

    model = HookedTransformer(Config(**SIZES, act_fn="solu", mlp_ln=True, normalization="RMS"))
    assert isinstance(model.blocks[0].mlp.ln, RMSNorm) and not hasattr(model.blocks[0].mlp.ln, "b")
