"""glassbox.models' xIELU activation and ALiBi tables, against transformers and hand computations."""

import math

import pytest
import torch

from glassbox.models.alibi import alibi_bias, alibi_multipliers, alibi_slope
from glassbox.models.xielu import XIELU, xielu


def test_xielu_against_transformers_module():
    from transformers.activations import XIELUActivation

    theirs = XIELUActivation(alpha_p_init=1.3, alpha_n_init=0.9, beta=0.2, eps=-1e-4, dtype=torch.float64)
    ours = XIELU(alpha_p_init=1.3, alpha_n_init=0.9, beta_init=0.2, eps=-1e-4, dtype=torch.float64)
    x = torch.linspace(-8, 5, 257, dtype=torch.float64)
    # same parameters (theirs [1], ours 0-dim): measured 0 in float64; 2 ulp allowed
    assert abs(ours.alpha_p.item() - theirs.alpha_p.item()) <= 5e-16
    assert abs(ours.alpha_n.item() - theirs.alpha_n.item()) <= 5e-16
    with torch.no_grad():
        ours.alpha_p.copy_(theirs.alpha_p[0])
        ours.alpha_n.copy_(theirs.alpha_n[0])
    assert torch.equal(ours(x), theirs._xielu_python(x))  # the same formula, op for op: measured equal


def test_xielu_hand_values():
    # x > 0: 0.8 x^2 + 0.5 x;  x <= 0: 0.8 (expm1(min(x, -1e-6)) - x) + 0.5 x, computed here in math
    for v in (2.0, 0.25, 0.0, -1e-7, -0.5, -3.0):
        want = 0.8 * v * v + 0.5 * v if v > 0 else 0.8 * (math.expm1(min(v, -1e-6)) - v) + 0.5 * v
        got = xielu(torch.tensor(v, dtype=torch.float64)).item()
        assert abs(got - want) <= 1e-15, v  # measured 0
    module = XIELU(dtype=torch.float64)
    x = torch.linspace(-4, 4, 33, dtype=torch.float64)
    assert (module(x) - xielu(x)).abs().max().item() <= 1e-15  # the module at its initial values: measured 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(alpha_p_init=-0.1), "alpha_p_init"), (dict(alpha_n_init=0.5, beta_init=0.6), "alpha_n_init"),
    (dict(eps=1e-3), "eps"), (dict(beta_init=float("nan")), "beta_init"), (dict(alpha_p_init="1"), "alpha_p_init"),
    (dict(eps=True), "eps"),
])
def test_xielu_refuses_values_it_cannot_represent(kwargs, field):
    with pytest.raises(ValueError, match=field):
        XIELU(**kwargs)


def test_xielu_at_the_edges_of_its_parameters():
    # alpha_n_init == beta_init stores alpha_n as -inf (softplus 0): alpha_n = beta exactly, output finite
    act = XIELU(alpha_p_init=1.0, alpha_n_init=1.0, beta_init=1.0, eps=-1e-6, dtype=torch.float64)
    x = torch.tensor([-3.0, -1.0, 0.0, 2.0], dtype=torch.float64)
    want = xielu(x, alpha_p=1.0, alpha_n=1.0, beta=1.0)
    assert torch.isfinite(act(x)).all() and (act(x) - want).abs().max().item() <= 1e-15  # measured 0


def test_alibi_against_bloom_for_power_of_two_heads():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n_heads in (4, 8, 16):
        n = 11
        # BLOOM's bias is m_h * k (one row for all queries); softmax ignores a per-row constant, so ours
        # (m_h * min(k - q, 0)) equals it plus -m_h * q on the causal part k <= q
        bloom = build_alibi_tensor(torch.ones(1, n), n_heads, torch.float32).view(n_heads, 1, n)
        q = torch.arange(n)[:, None]
        shifted = bloom - alibi_multipliers(n_heads)[:, None, None] * q
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        ours = alibi_bias(n_heads, n)
        # measured 0, 0, 4.8e-7 for 4, 8, 16 heads (float32 products of distances up to 10); bound 4e-6
        assert (ours - shifted)[:, causal].abs().max().item() <= 4e-6, n_heads
        assert torch.equal(ours[:, ~causal], torch.zeros_like(ours[:, ~causal]))


def test_alibi_hand_values():
    assert torch.equal(alibi_slope(3), torch.tensor([[0.0, 0, 0], [-1, 0, 0], [-2, -1, 0]]))
    # 3 heads: r = 2^(-8/3); m = r, r^2, r^3 = 2^-8
    want = torch.tensor([2 ** (-8 / 3), 2 ** (-16 / 3), 2 ** -8], dtype=torch.float64)
    assert (alibi_multipliers(3).double() - want).abs().max().item() <= 3e-8  # float32 rounding: measured 3.0e-9
    assert alibi_bias(3, 4).shape == (3, 4, 4) and alibi_bias(3, 4)[2, 3, 0].item() == -3 * 2 ** -8


@pytest.mark.parametrize("bad", [0, -2, 2.0, True, None])
def test_alibi_refuses_bad_sizes(bad):
    with pytest.raises(ValueError, match="n_ctx"):
        alibi_slope(bad)
    with pytest.raises(ValueError, match="n_heads"):
        alibi_multipliers(bad)
