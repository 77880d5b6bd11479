"""Composition scores against ||L R||_F / (||L||_F ||R||_F) of the explicit matrices, in float64.

Sizes are distinct (d 11, hidden dims 3 and 4, leading 2x3 against 5) so a swapped axis fails.
"""

import pytest
import torch
from torch.testing import assert_close

from glassbox.interp.composition import all_composition_scores, composition_scores
from glassbox.interp.factored_matrix import FactoredMatrix
from glassbox.models import Config, HookedTransformer

F64 = torch.float64


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def explicit_score(L: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    fro = torch.linalg.matrix_norm
    return fro(L @ R) / (fro(L) * fro(R))


def test_every_left_against_every_right_equals_the_explicit_ratio():
    left = FactoredMatrix(randn(2, 3, 7, 3, seed=1), randn(2, 3, 3, 11, seed=2))  # [2 3] of [7 11]
    right = FactoredMatrix(randn(5, 11, 4, seed=3), randn(5, 4, 13, seed=4))  # [5] of [11 13]
    scores = composition_scores(left, right)
    assert scores.shape == (2, 3, 5)
    L, R = left.AB, right.AB
    expected = torch.stack([torch.stack([torch.stack([explicit_score(L[i, j], R[k]) for k in range(5)])
                                         for j in range(3)]) for i in range(2)])
    # measured 4.4e-16 (scores up to 0.44), bound 5e-15: 11x
    assert_close(scores, expected, atol=5e-15, rtol=0)


def test_without_broadcast_dims_leading_dims_pair_up():
    left = FactoredMatrix(randn(5, 7, 3, seed=1), randn(5, 3, 11, seed=2))
    right = FactoredMatrix(randn(5, 11, 4, seed=3), randn(5, 4, 13, seed=4))
    scores = composition_scores(left, right, broadcast_dims=False)
    assert scores.shape == (5,)
    expected = torch.stack([explicit_score(left.AB[k], right.AB[k]) for k in range(5)])
    # measured 1.7e-16 (scores up to 0.31), bound 2e-15: 12x
    assert_close(scores, expected, atol=2e-15, rtol=0)
    diagonal = composition_scores(left, right)[torch.arange(5), torch.arange(5)]
    # measured 0 (the same products of the same entries); bound 1e-15 allows a reordered batched matmul
    assert_close(scores, diagonal, atol=1e-15, rtol=0)


def test_aligned_circuits_score_one_and_orthogonal_ones_zero():
    u, v, w = randn(7, seed=1), randn(11, seed=2), randn(13, seed=3)
    left = FactoredMatrix(u[:, None], v[None, :])  # writes only along v
    reads_v = FactoredMatrix(v[:, None], w[None, :])
    v_perp = randn(11, seed=4)
    v_perp = v_perp - (v_perp @ v) / (v @ v) * v
    reads_perp = FactoredMatrix(v_perp[:, None], w[None, :])
    # identities: ||u v^T v w^T|| = |u| |v|^2 |w| = ||u v^T|| ||v w^T||; v^T v_perp = 0
    # measured 2.2e-16 and 3.1e-17, bound 3e-15: 14x and more
    one, zero = torch.tensor(1.0, dtype=F64), torch.tensor(0.0, dtype=F64)
    assert_close(composition_scores(left, reads_v), one, atol=3e-15, rtol=0)
    assert_close(composition_scores(left, reads_perp), zero, atol=3e-15, rtol=0)


def test_a_score_is_invariant_to_scale_and_to_how_a_matrix_is_factored():
    left = FactoredMatrix(randn(7, 3, seed=1), randn(3, 11, seed=2))
    right = FactoredMatrix(randn(11, 4, seed=3), randn(4, 13, seed=4))
    mix = randn(3, 3, seed=5)
    refactored = FactoredMatrix(left.A @ mix, torch.linalg.solve(mix, left.B))  # same product
    base = composition_scores(left, right)
    # measured 5.6e-17 and 0 (score 0.39), bound 2e-15: 36x
    assert_close(composition_scores(left * 7.0, right * 0.2), base, atol=2e-15, rtol=0)
    assert_close(composition_scores(refactored, right), base, atol=2e-15, rtol=0)


def test_mismatched_inner_dims_and_non_factored_inputs_are_refused():
    left = FactoredMatrix(randn(7, 3, seed=1), randn(3, 11, seed=2))
    with pytest.raises(ValueError, match="rdim == right's ldim"):
        composition_scores(left, left)
    with pytest.raises(TypeError, match="right"):  # by glassbox or, under the shape checker, by it
        composition_scores(left, randn(11, 5, seed=3))
    other = FactoredMatrix(randn(2, 11, 3, seed=1), randn(2, 3, 5, seed=2))
    three = FactoredMatrix(randn(3, 7, 3, seed=1), randn(3, 3, 11, seed=2))
    with pytest.raises(ValueError, match="do not broadcast"):
        composition_scores(three, other, broadcast_dims=False)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(d_model=17, n_layers=3, n_heads=2, d_head=5, d_mlp=19, d_vocab=23, n_ctx=11),
                             dtype=F64).eval()


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_of_a_model_equal_the_explicit_circuits(model, mode):
    with torch.no_grad():
        scores = all_composition_scores(model, mode)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    assert scores.shape == (n_layers, n_heads, n_layers, n_heads)
    W_Q, W_K, W_V, W_O = (model.W_Q.detach(), model.W_K.detach(), model.W_V.detach(), model.W_O.detach())
    expected = torch.zeros_like(scores)
    for l1 in range(n_layers):
        for h1 in range(n_heads):
            OV = W_V[l1, h1] @ W_O[l1, h1]
            for l2 in range(n_layers):
                for h2 in range(n_heads):
                    QK = W_Q[l2, h2] @ W_K[l2, h2].T
                    right = {"Q": QK, "K": QK.T, "V": W_V[l2, h2] @ W_O[l2, h2]}[mode]
                    if l2 > l1:  # no composition into the same or an earlier layer: 0 there
                        expected[l1, h1, l2, h2] = explicit_score(OV, right)
    later = torch.arange(n_layers)[:, None, None, None] < torch.arange(n_layers)[None, None, :, None]
    assert bool((scores[~later.expand_as(scores)] == 0).all())  # masked to exactly 0
    # measured 3.9e-16 (scores up to 0.32), bound 5e-15: 13x
    assert_close(scores, expected, atol=5e-15, rtol=0)


def test_q_and_k_composition_differ_and_a_bad_mode_is_refused(model):
    with torch.no_grad():
        q, k = all_composition_scores(model, "Q"), all_composition_scores(model, "K")
    assert float((q - k).abs().max()) > 1e-3  # QK is not symmetric, so reading via queries or keys differs
    with pytest.raises(ValueError, match="mode must be one of"):
        all_composition_scores(model, "O")
