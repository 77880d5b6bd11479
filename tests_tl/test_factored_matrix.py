"""glassbox's FactoredMatrix against TransformerLens 3.9's on the same factors.

Singular vectors are unique only up to sign, so vectors are compared through sign-free products
(U diag(S) V^T, V diag(S)^2 V^T); everything else is compared directly. Factors have distinct sizes
(leading 2 x 3, ldim 7, mdim 5, rdim 11) so a swapped axis cannot pass.
"""

import pytest
import torch
from transformer_lens.FactoredMatrix import FactoredMatrix as TLFactoredMatrix

from glassbox.interp.factored_matrix import FactoredMatrix
from tl_oracle import max_diff, tiny_model, tl_twin


def factors(seed=0, lead=(2, 3), ldim=7, mdim=5, rdim=11):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, ldim, mdim, generator=g), torch.randn(*lead, mdim, rdim, generator=g)


def both(A, B):
    return FactoredMatrix(A, B), TLFactoredMatrix(A, B)


def test_products_and_shapes_equal_transformer_lens():
    ours, theirs = both(*factors())
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert (ours.ldim, ours.mdim, ours.rdim) == (theirs.ldim, theirs.mdim, theirs.rdim)
    assert torch.equal(ours.AB, theirs.AB)
    assert torch.equal(ours.T.AB, theirs.T.AB)
    square_ours, square_theirs = both(*factors(1, rdim=7))
    assert torch.equal(square_ours.BA, square_theirs.BA)
    X = torch.randn(11, 4, generator=torch.Generator().manual_seed(2))
    for a, b in ((ours @ X, theirs @ X), (X.T @ ours.T, X.T @ theirs.T)):
        assert tuple(a.shape) == tuple(b.shape)
        assert torch.equal(a.AB, b.AB)
    v = torch.randn(11, generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours @ v, theirs @ v)
    other_ours, other_theirs = both(*factors(4, ldim=11, mdim=3, rdim=6))
    product_ours, product_theirs = ours @ other_ours, theirs @ other_theirs
    assert product_ours.mdim == product_theirs.mdim
    assert torch.equal(product_ours.AB, product_theirs.AB)
    assert torch.equal((ours * 2.5).AB, (theirs * 2.5).AB)


def test_svd_norm_eigenvalues_equal_transformer_lens():
    ours, theirs = both(*factors())
    U, S, V = ours.svd()
    tU, tS, tV = theirs.svd()
    assert U.shape == tU.shape and S.shape == tS.shape and V.shape == tV.shape
    assert max_diff(S, tS) < 3e-5  # measured 2.9e-6 (values up to 17), bound 3e-5: 10x
    assert max_diff(U @ torch.diag_embed(S) @ V.transpose(-1, -2),
                    tU @ torch.diag_embed(tS) @ tV.transpose(-1, -2)) < 3e-5  # measured 3.3e-6 (up to 8.4), 3e-5: 9x
    assert max_diff(ours.norm(), theirs.norm()) < 2e-5  # measured 1.9e-6 (values up to 21), bound 2e-5: 10x
    gram = lambda M: M.transpose(-1, -2) @ M
    # measured 3.4e-5 and 9.2e-5 (values up to 154), bound 1e-3: 11x
    assert max_diff(gram(ours.collapse_l()), gram(theirs.collapse_l())) < 1e-3
    assert max_diff(gram(ours.collapse_r().transpose(-1, -2)), gram(theirs.collapse_r().transpose(-1, -2))) < 1e-3
    even_ours, even_theirs = ours.make_even(), theirs.make_even()
    assert max_diff(even_ours.AB, even_theirs.AB) < 3e-5  # measured 3.3e-6 (values up to 8.4), bound 3e-5: 9x
    # balanced factors: measured 1.4e-6 (norms up to 9), bound 1.5e-5: 10x
    assert max_diff(even_ours.A.norm(dim=(-2, -1)), even_ours.B.norm(dim=(-2, -1))) < 1.5e-5
    square_ours, square_theirs = both(*factors(5, rdim=7))
    key = lambda e: torch.sort(e.real * 1000 + e.imag, dim=-1).values
    assert torch.equal(key(square_ours.eigenvalues), key(square_theirs.eigenvalues))


def test_indexing_and_corner_equal_transformer_lens():
    ours, theirs = both(*factors())
    for index in (0, (1, 2), (slice(None), 1), (0, slice(1, 3))):
        a, b = ours[index], theirs[index]
        assert tuple(a.shape) == tuple(b.shape), index
        assert torch.equal(a.AB, b.AB), index
    assert torch.equal(ours.get_corner(3), theirs.get_corner(3))
    assert tuple(ours.unsqueeze(1).shape) == tuple(theirs.unsqueeze(1).shape)


def test_model_circuits_equal_transformer_lens():
    model = tiny_model(0)
    twin = tl_twin(model)
    for ours, theirs in ((model.OV, twin.OV), (model.QK, twin.QK)):
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert torch.equal(ours.AB, theirs.AB)
        # measured 7.2e-7 (singular values up to 1.8), bound 7e-6: 10x
        assert max_diff(ours.S.detach(), theirs.S.detach()) < 7e-6


@pytest.mark.parametrize("bad", [lambda: FactoredMatrix(torch.ones(3, 4), torch.ones(5, 2))])
def test_mismatched_inner_dims_are_refused(bad):
    with pytest.raises(ValueError, match="inner dims"):
        bad()


def r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# Each case is run on both classes with the same inputs: glassbox's error is a ValueError (glassbox's own
# contract) that is also TransformerLens's type, and holds the words TransformerLens's tests look for.
ERROR_CASES = {
    "inner_dims": (lambda F: F(r(2, 3, 4), r(2, 3, 5)), "inner dimension"),
    "leading_dims": (lambda F: F(r(2, 3, 4), r(3, 4, 5)), "Shape mismatch"),
    "matmul_inner": (lambda F: F(r(3, 4), r(4, 6)) @ r(5, 6), None),
    "matmul_inner_batch": (lambda F: F(r(3, 4), r(4, 6)) @ r(2, 5, 6), None),
    "rmatmul_inner": (lambda F: r(5, 6) @ F(r(3, 4), r(4, 6)), None),
    "matmul_leading": (lambda F: F(r(2, 3, 4), r(2, 4, 6)) @ r(4, 6, 7), None),
    "matmul_leading_two": (lambda F: F(r(2, 9, 3, 4), r(2, 9, 4, 6)) @ r(2, 6, 7), None),
    "rmatmul_leading": (lambda F: r(4, 6, 3) @ F(r(2, 3, 4), r(2, 4, 6)), None),
    "factored_inner": (lambda F: F(r(3, 4), r(4, 6)) @ F(r(5, 2), r(2, 3)), None),
    "factored_leading": (lambda F: F(r(2, 3, 4), r(2, 4, 6)) @ F(r(3, 6, 2), r(3, 2, 3)), None),
    "scalar_not_scalar": (lambda F: F(r(3, 4), r(4, 6)) * r(2), None),
    "BA_not_square": (lambda F: F(r(3, 4), r(4, 6)).BA, None),
    "eigenvalues_not_square": (lambda F: F(r(3, 4), r(4, 6)).eigenvalues, None),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_are_transformer_lens_types(case):
    call, words = ERROR_CASES[case]
    with pytest.raises(Exception) as theirs:
        call(TLFactoredMatrix)
    with pytest.raises(ValueError) as ours:
        call(FactoredMatrix)
    kind = type(theirs.value)
    assert kind in (AssertionError, RuntimeError), kind  # what TransformerLens 3.9 raises here
    assert isinstance(ours.value, kind), f"{type(ours.value).__mro__} is not a {kind.__name__}"
    if words:
        assert words in str(theirs.value) and words in str(ours.value)


def test_has_leading_dims_and_Vh_are_transformer_lens_names():
    for A, B in [(r(3, 4), r(4, 6)), (r(3, 4), r(2, 4, 6)), (r(2, 3, 4), r(4, 6))]:
        ours, theirs = both(A, B)
        assert ours.has_leading_dims == theirs.has_leading_dims
    ours, theirs = both(r(2, 3, 4), r(2, 4, 6))
    with pytest.warns(DeprecationWarning):
        Vh = ours.Vh
    assert torch.equal(Vh, ours.V)  # TransformerLens's Vh has always been V
    # sign-free: V S^2 V^T, measured 9.5e-7 (values up to 180)
    gram = lambda m, V: (V * m.S[..., None, :] ** 2) @ V.transpose(-2, -1)
    with pytest.warns(DeprecationWarning):
        assert max_diff(gram(ours, Vh), gram(theirs, theirs.Vh)) < 2e-5
