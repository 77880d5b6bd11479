"""FactoredMatrix against its explicit product M = A @ B and torch.linalg on M, in float64.

Sizes are distinct primes (ldim 7, mdim 5, rdim 11, leading 3 and 2...), so a swapped axis fails.
Bounds are absolute (rtol=0); each states beside it the worst error measured over the two CPU code
paths of tests/bound_log.py, and the size of the values compared.
"""

import numpy as np
import pytest
import torch
from jaxtyping import TypeCheckError
from torch.testing import assert_close

from glassbox.interp import FactoredMatrix
from glassbox.models import Config, HookedTransformer

F64 = torch.float64


def randn(*shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=F64)


# (ldim, mdim, rdim): hidden dim smallest, largest, and in between.
SHAPES = [(7, 5, 11), (7, 13, 11), (11, 7, 5), (5, 7, 11)]


@pytest.fixture(params=SHAPES, ids=lambda s: "x".join(map(str, s)))
def factors(request):
    ldim, mdim, rdim = request.param
    return randn(3, ldim, mdim, seed=1), randn(3, mdim, rdim, seed=2)


# -- construction -------------------------------------------------------------------------------
def test_shape_and_leading_dims_broadcast():
    A, B = randn(3, 1, 7, 5, seed=1), randn(2, 5, 11, seed=2)
    M = FactoredMatrix(A, B)
    assert M.shape == (3, 2, 7, 11) and M.ndim == 4 and (M.ldim, M.mdim, M.rdim) == (7, 5, 11)
    assert M.A.shape == (3, 2, 7, 5) and M.B.shape == (3, 2, 5, 11)
    assert repr(M) == "FactoredMatrix(shape=(3, 2, 7, 11), mdim=5, dtype=torch.float64)"
    for i in range(3):
        for j in range(2):
            # one matmul each way, same kernel: measured 0, bound 1e-13
            assert_close(M.AB[i, j], A[i, 0] @ B[j], atol=1e-13, rtol=0)  # measured 0 (values up to 11), bound 1e-13
    assert M.pair[0] is M.A and M.pair[1] is M.B


@pytest.mark.parametrize("A, B, match", [
    (randn(7, 5), randn(6, 11), r"inner dims differ: A \(7, 5\) has mdim 5, B \(6, 11\) has 6"),
    (randn(3, 7, 5), randn(2, 5, 11), r"leading dims \(3,\) and \(2,\) do not broadcast"),
    (randn(7, 5), randn(5, 11).float(), "A is torch.float64 on cpu, B torch.float32"),
])
def test_construction_errors_name_the_shapes(A, B, match):
    with pytest.raises(ValueError, match=match):
        FactoredMatrix(A, B)


@pytest.mark.parametrize("A, B, match", [
    (randn(5), randn(5, 11), r"A must be a tensor of at least 2 dims, got \(5,\)"),
    (randn(7, 5), [[1.0]], "B must be a tensor of at least 2 dims, got list"),
])
def test_factors_that_are_not_matrices_fail_with_or_without_the_checker(A, B, match):
    with pytest.raises(TypeCheckError, match="parameter '[AB]'"):
        FactoredMatrix(A, B)
    unchecked = FactoredMatrix.__new__(FactoredMatrix)
    with pytest.raises(ValueError, match=match):
        FactoredMatrix.__init__.__wrapped__(unchecked, A, B)


# -- products -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mdim, rdim", [(5, 11), (13, 11), (11, 11)])
def test_matrix_on_the_right_keeps_the_smaller_hidden_dim(mdim, rdim):
    A, B, X = randn(3, 7, mdim, seed=1), randn(3, mdim, rdim, seed=2), randn(2, 1, rdim, 17, seed=3)
    product = FactoredMatrix(A, B) @ X
    assert product.shape == (2, 3, 7, 17) and product.mdim == min(mdim, rdim)
    assert_close(product.AB, (A @ B) @ X, atol=1.5e-13, rtol=0)  # measured 1.4e-14 (values up to 52), bound 1.5e-13


@pytest.mark.parametrize("ldim, mdim", [(7, 5), (7, 13), (7, 7)])
def test_matrix_on_the_left_keeps_the_smaller_hidden_dim(ldim, mdim):
    A, B, X = randn(3, ldim, mdim, seed=1), randn(3, mdim, 11, seed=2), randn(2, 1, 17, ldim, seed=3)
    product = X @ FactoredMatrix(A, B)
    assert isinstance(product, FactoredMatrix)
    assert product.shape == (2, 3, 17, 11) and product.mdim == min(ldim, mdim)
    assert_close(product.AB, X @ (A @ B), atol=1e-13, rtol=0)  # measured 7.1e-15 (values up to 38), bound 1e-13


def test_vectors_on_either_side_give_tensors(factors):
    A, B = factors
    M = FactoredMatrix(A, B)
    right, left = randn(M.rdim, seed=3), randn(M.ldim, seed=4)
    assert (M @ right).shape == (3, M.ldim) and (left @ M).shape == (3, M.rdim)
    # measured 3.6e-15 (values up to 19), bound 4e-14
    assert_close(M @ right, ((A @ B) @ right[:, None])[..., 0], atol=4e-14, rtol=0)
    # measured 7.1e-15 (values up to 35), bound 1e-13
    assert_close(left @ M, (left[None, :] @ (A @ B))[..., 0, :], atol=1e-13, rtol=0)


@pytest.mark.parametrize("sizes", [(7, 5, 11, 13, 3), (7, 13, 3, 11, 5), (7, 13, 11, 5, 3), (3, 3, 3, 3, 3)])
def test_product_of_two_splits_at_the_smallest_inner_dim(sizes):
    l1, m1, r1, m2, r2 = sizes
    A1, B1 = randn(2, 1, l1, m1, seed=1), randn(2, 1, m1, r1, seed=2)
    A2, B2 = randn(3, r1, m2, seed=3), randn(3, m2, r2, seed=4)
    product = FactoredMatrix(A1, B1) @ FactoredMatrix(A2, B2)
    assert product.shape == (2, 3, l1, r2) and product.mdim == min(m1, r1, m2)
    # measured 2.8e-14 (values up to 110), bound 3e-13
    assert_close(product.AB, (A1 @ B1) @ (A2 @ B2), atol=3e-13, rtol=0)


def test_scalar_multiplication():
    A, B = randn(3, 7, 5, seed=1), randn(5, 11, seed=2)
    M = A @ B
    # measured 5.3e-15 (values up to 23), bound 6e-14
    assert_close((FactoredMatrix(A, B) * 2.5).AB, 2.5 * M, atol=6e-14, rtol=0)
    # measured 7.1e-15 (values up to 28), bound 1e-13
    assert_close((-3 * FactoredMatrix(A, B)).AB, -3 * M, atol=1e-13, rtol=0)
    scaled = FactoredMatrix(A, B) * torch.tensor([[0.5]], dtype=F64)  # one element: a scalar
    assert scaled.shape == (3, 7, 11)
    assert_close(scaled.AB, 0.5 * M, atol=1e-13, rtol=0)  # measured 0 (values up to 5), bound 1e-13
    with pytest.raises(ValueError, match=r"tensor \(2,\): \* takes a scalar; use @"):
        FactoredMatrix(A, B) * torch.ones(2, dtype=F64)
    with pytest.raises(TypeError):
        FactoredMatrix(A, B) * FactoredMatrix(A, B)


def test_product_errors_name_the_shapes():
    M = FactoredMatrix(randn(7, 5), randn(5, 11))
    with pytest.raises(ValueError, match=r"shape=\(7, 11\).* @ tensor \(7, 3\): inner dims differ \(11 against 7\)"):
        M @ randn(7, 3)
    with pytest.raises(ValueError, match=r"tensor \(3, 11\) @ .*shape=\(7, 11\).*inner dims differ \(11 against 7\)"):
        randn(3, 11) @ M
    with pytest.raises(ValueError, match=r"inner dims differ \(11 against 7\)"):
        M @ randn(7)
    with pytest.raises(ValueError, match=r"inner dims differ \(11 against 7\)"):
        M @ M
    batched = FactoredMatrix(randn(3, 7, 5), randn(3, 5, 11))
    with pytest.raises(ValueError, match=r"leading dims \(3,\) and \(2,\) do not broadcast"):
        batched @ randn(2, 11, 13)
    with pytest.raises(ValueError, match=r"leading dims \(3,\) and \(2,\) do not broadcast"):
        batched @ FactoredMatrix(randn(2, 11, 5), randn(2, 5, 7))
    with pytest.raises(ValueError, match="use \\* for a scalar"):
        M @ torch.tensor(2.0, dtype=F64)


def test_AB_BA_and_transpose(factors):
    A, B = factors
    M = FactoredMatrix(A, B)
    assert_close(M.AB, A @ B, atol=0, rtol=0)  # the same product
    # measured 1.8e-15 (values up to 16), bound 2e-14
    assert_close(M.T.AB, (A @ B).transpose(-2, -1), atol=2e-14, rtol=0)
    square = FactoredMatrix(A, randn(3, M.mdim, M.ldim, seed=3))
    assert_close(square.BA, square.B @ A, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"BA needs a square matrix \(ldim == rdim\), this is .*shape=\(3, 7, 11\)"):
        FactoredMatrix(randn(3, 7, 5), randn(3, 5, 11)).BA


# -- spectra ------------------------------------------------------------------------------------
def test_svd_reconstructs_M_with_the_singular_values_of_M(factors):
    A, B = factors
    M, F = A @ B, FactoredMatrix(A, B)
    U, S, V = F.svd()
    k = min(F.ldim, F.mdim, F.rdim)
    assert U.shape == (3, F.ldim, k) and S.shape == (3, k) and V.shape == (3, F.rdim, k)
    # measured 3.9e-14 (|M| up to 16), bound 4e-13
    assert_close(U @ torch.diag_embed(S) @ V.transpose(-2, -1), M, atol=4e-13, rtol=0)
    expected = torch.linalg.svdvals(M)
    assert_close(S, expected[..., :k], atol=5e-13, rtol=0)  # measured 4.3e-14 (S up to 23), bound 5e-13
    # M has rank k: measured 2.1e-15, bound 2e-14
    assert_close(expected[..., k:], torch.zeros_like(expected[..., k:]), atol=2e-14, rtol=0)
    eye = torch.eye(k, dtype=F64).expand(3, k, k)
    assert_close(U.transpose(-2, -1) @ U, eye, atol=2e-14, rtol=0)  # orthonormal columns: measured 1.9e-15, bound 2e-14
    assert_close(V.transpose(-2, -1) @ V, eye, atol=3e-14, rtol=0)  # measured 2.9e-15, bound 3e-14
    assert F.U is U and F.S is S and F.V is V and F.svd()[0] is U  # computed once


def test_svd_of_broadcast_leading_dims():
    A, B = randn(2, 1, 7, 5, seed=1), randn(3, 5, 11, seed=2)
    U, S, V = FactoredMatrix(A, B).svd()
    assert S.shape == (2, 3, 5)
    # measured 2.3e-14 (|M| up to 11), bound 3e-13
    assert_close(U @ torch.diag_embed(S) @ V.transpose(-2, -1), A @ B, atol=3e-13, rtol=0)
    # measured 3.9e-14 (S up to 20), bound 4e-13
    assert_close(S, torch.linalg.svdvals(A @ B)[..., :5], atol=4e-13, rtol=0)


def test_norm_is_the_frobenius_norm_of_M(factors):
    A, B = factors
    norm = FactoredMatrix(A, B).norm()
    assert norm.shape == (3,)
    # measured 3.9e-14 (norms up to 36), bound 4e-13
    assert_close(norm, torch.linalg.matrix_norm(A @ B), atol=4e-13, rtol=0)
    assert FactoredMatrix(A[0], B[0]).norm().shape == ()


@pytest.mark.parametrize("ldim, mdim", [(7, 5), (5, 7), (7, 7)])
def test_eigenvalues_are_the_nonzero_eigenvalues_of_M(ldim, mdim):
    A, B = randn(3, ldim, mdim, seed=1), randn(3, mdim, ldim, seed=2)
    eigenvalues = FactoredMatrix(A, B).eigenvalues
    assert eigenvalues.shape == (3, mdim) and eigenvalues.is_complex()
    expected = torch.linalg.eigvals(A @ B)  # [3 ldim]: mdim nonzero, ldim - mdim zero when mdim < ldim
    n = max(ldim, mdim)

    def padded_sorted_magnitudes(values):
        values = torch.cat([values.abs(), torch.zeros(3, n - values.shape[-1], dtype=F64)], dim=-1)
        return values.sort(dim=-1, descending=True).values

    # measured 2.0e-14 (magnitudes up to 10; M's zero eigenvalues come out near 1e-15), bound 2e-13
    assert_close(padded_sorted_magnitudes(eigenvalues), padded_sorted_magnitudes(expected), atol=2e-13, rtol=0)
    # both sums are the trace of M: measured 3.6e-14 (traces up to 12), bound 4e-13
    assert_close(eigenvalues.sum(-1), expected.sum(-1), atol=4e-13, rtol=0)
    with pytest.raises(ValueError, match="BA needs a square matrix"):
        FactoredMatrix(A, randn(3, mdim, ldim + 2)).eigenvalues


def test_make_even_and_collapses_keep_M(factors):
    A, B = factors
    M, F = A @ B, FactoredMatrix(A, B)
    k = min(F.ldim, F.mdim, F.rdim)
    even = F.make_even()
    assert even.mdim == k
    assert_close(even.AB, M, atol=4e-13, rtol=0)  # measured 3.8e-14 (|M| up to 16), bound 4e-13
    # even: both factors' Gram matrices are diag(S)
    # measured 2.5e-14 (S up to 23), bound 3e-13
    assert_close(even.A.transpose(-2, -1) @ even.A, torch.diag_embed(F.S), atol=3e-13, rtol=0)
    # measured 4.6e-14, bound 5e-13
    assert_close(even.B @ even.B.transpose(-2, -1), torch.diag_embed(F.S), atol=5e-13, rtol=0)
    assert F.collapse_l().shape == (3, k, F.rdim) and F.collapse_r().shape == (3, F.ldim, k)
    assert_close(F.U @ F.collapse_l(), M, atol=4e-13, rtol=0)  # measured 3.8e-14, bound 4e-13
    assert_close(F.collapse_r() @ F.V.transpose(-2, -1), M, atol=4e-13, rtol=0)  # measured 3.9e-14, bound 4e-13


def test_half_precision_spectra_come_in_float32():
    A, B = randn(7, 5, seed=1).to(torch.bfloat16), randn(5, 7, seed=2).to(torch.bfloat16)
    F = FactoredMatrix(A, B)
    assert F.S.dtype == torch.float32 and F.eigenvalues.dtype == torch.complex64
    expected = torch.linalg.svdvals(A.double() @ B.double())[:5]
    assert_close(F.S.double(), expected, atol=1e-4, rtol=0)  # measured 7.0e-6 (S up to 9), bound 1e-4


# -- shape --------------------------------------------------------------------------------------
def test_get_corner_unsqueeze_and_shape():
    A, B = randn(2, 7, 5, seed=1), randn(2, 5, 11, seed=2)
    F, M = FactoredMatrix(A, B), A @ B
    assert_close(F.get_corner(3), M[:2, :3, :3], atol=1e-13, rtol=0)  # measured 0 (values up to 11), bound 1e-13
    assert_close(F.get_corner(), M[:3, :3, :3], atol=1e-13, rtol=0)  # measured 0, bound 1e-13
    assert_close(F.get_corner(20), M, atol=1e-13, rtol=0)  # measured 0, bound 1e-13
    assert F.unsqueeze(0).shape == (1, 2, 7, 11) and F.unsqueeze(1).shape == (2, 1, 7, 11)
    assert F.unsqueeze(-3).shape == (2, 1, 7, 11) and F.unsqueeze(-4).shape == (1, 2, 7, 11)
    assert_close(F.unsqueeze(1).AB[:, 0], M, atol=0, rtol=0)
    for k in (2, -1, -2, -5):
        with pytest.raises(IndexError, match=rf"unsqueeze\({k}\).*before the two matrix dims"):
            F.unsqueeze(k)


def test_indexing_leading_dims():
    A, B = randn(3, 2, 7, 5, seed=1), randn(3, 2, 5, 11, seed=2)
    F, M = FactoredMatrix(A, B), A @ B
    for idx in (1, -1, (2, 0), slice(1, 3), (slice(None), 1), [2, 0], (torch.tensor([0, 2]), 1), None,
                (1, None), ..., (..., 1, slice(None), slice(None))):
        result = F[idx]
        assert_close(result.AB, M[idx], atol=1e-13, rtol=0)  # measured 0 (values up to 11), bound 1e-13
        assert result.mdim == 5


def test_indexing_rows_and_columns_keeps_both_dims():
    A, B = randn(3, 7, 5, seed=1), randn(3, 5, 11, seed=2)
    F, M = FactoredMatrix(A, B), A @ B
    cases = [  # (index into F, the same entries of M with the row and column dims kept)
        ((1, 4), M[1, 4:5]),
        ((1, -1), M[1, -1:]),
        ((0, 2, 3), M[0, 2:3, 3:4]),
        ((0, -1, -1), M[0, -1:, -1:]),
        ((slice(None), [0, 6], torch.tensor([1, 10])), M[:, [0, 6]][:, :, [1, 10]]),
        ((2, slice(1, 4), 0), M[2, 1:4, 0:1]),
        ((..., 3), M[:, :, 3:4]),
        ((None, 1, 2), M[None, 1, 2:3]),
        ((1, torch.tensor(4)), M[1, 4:5]),
        ((np.array([2, 0]), np.array([1, 3])), M[[2, 0]][:, [1, 3]]),
    ]
    for idx, expected in cases:
        assert_close(F[idx].AB, expected, atol=1e-13, rtol=0)  # measured 0 (values up to 5), bound 1e-13


@pytest.mark.parametrize("idx, match", [
    ((0, 1, 2, 3), r"has 4 entries; at most 3: 1 leading, then rows and columns"),
    ((0, 7), r"row 7 is out of range for 7 rows"),
    ((0, 0, -12), r"column -12 is out of range for 11 columns"),
    (5, r"index 5 into FactoredMatrix\(shape=\(3, 7, 11\).*out of bounds"),
    ((0, [[0, 1]]), r"a row index is an int, a slice or a 1-d sequence of ints"),
    ((0, 0.5), r"a row index is an int, a slice or a 1-d sequence of ints"),
    ((0, 1, None), r"None \(a new axis\) can stand only among the leading indices"),
    ((..., 0, ...), r"at most one \.\.\."),
])
def test_bad_indexing_fails_naming_the_shape(idx, match):
    F = FactoredMatrix(randn(3, 7, 5), randn(3, 5, 11))
    with pytest.raises(IndexError, match=match):
        F[idx]


# -- a model's circuits -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    cfg = Config(d_model=11, n_layers=2, n_heads=3, d_head=5, d_vocab=13, n_ctx=7, use_bias=False)
    torch.manual_seed(0)
    model = HookedTransformer(cfg, dtype=F64).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    return model


def test_OV_and_QK_are_every_heads_circuit(model):
    OV, QK = model.OV, model.QK
    assert OV.shape == QK.shape == (2, 3, 11, 11) and OV.mdim == QK.mdim == 5
    for layer, block in enumerate(model.blocks):
        for head in range(3):
            attn = block.attn
            with torch.no_grad():
                # measured 0 for OV, 1.1e-16 for QK (values up to 0.9), bound 1.5e-15
                assert_close(OV.AB[layer, head], attn.W_V[head] @ attn.W_O[head], atol=1.5e-15, rtol=0)
                assert_close(QK.AB[layer, head], attn.W_Q[head] @ attn.W_K[head].T, atol=1.5e-15, rtol=0)


def test_OV_and_QK_compute_what_the_model_does(model):
    """Scores = x QK x^T / sqrt(d_head) (query on the left); attn_out = sum over heads of pattern x OV."""
    tokens = torch.tensor([[1, 5, 2, 12, 0, 7, 3]])
    _, cache = model.run_with_cache(tokens)
    OV, QK = model.OV, model.QK
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    for layer in range(2):
        x = cache[f"blocks.{layer}.ln1.hook_out"][0]  # [pos d_model], what the attention reads
        with torch.no_grad():
            scores = x @ QK[layer].AB @ x.T / 5 ** 0.5  # [head query_pos key_pos]
            out = (cache[f"blocks.{layer}.attn.hook_pattern"][0] @ (x @ OV[layer].AB)).sum(0)
        expected = cache[f"blocks.{layer}.attn.hook_attn_scores"][0]
        # measured 1.1e-15 (scores up to 3.1), bound 1.5e-14
        assert_close(scores[:, causal], expected[:, causal], atol=1.5e-14, rtol=0)
        # measured 7.8e-16 (values up to 3.5), bound 1e-14
        assert_close(out, cache[f"blocks.{layer}.hook_attn_out"][0], atol=1e-14, rtol=0)


def test_shape_errors_are_also_transformer_lens_types():
    from glassbox.hooks.errors import ArgumentError, BroadcastError

    A, B = torch.randn(3, 4), torch.randn(4, 6)
    for call, kind in [(lambda: FactoredMatrix(A, torch.randn(5, 6)), AssertionError),
                       (lambda: FactoredMatrix(A, B) @ torch.randn(5, 6), AssertionError),
                       (lambda: FactoredMatrix(A, B) * torch.randn(2), AssertionError),
                       (lambda: FactoredMatrix(A, B).BA, AssertionError),
                       (lambda: FactoredMatrix(torch.randn(2, 3, 4), torch.randn(3, 4, 6)), RuntimeError),
                       (lambda: FactoredMatrix(A[None].expand(2, 3, 4), B) @ torch.randn(3, 6, 2), RuntimeError)]:
        with pytest.raises(ValueError) as error:
            call()
        assert isinstance(error.value, kind) and isinstance(error.value, (ArgumentError, BroadcastError))
    assert not FactoredMatrix(A, B).has_leading_dims and FactoredMatrix(A, B[None]).has_leading_dims
