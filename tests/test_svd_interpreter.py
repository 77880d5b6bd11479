"""Singular vocabulary directions against torch.linalg.svd of the explicit matrices times W_U.

A float64 model with distinct sizes (d_model 13, d_head 5, d_mlp 19, d_vocab 23); LayerNorm weights
perturbed, so folding ln2's weight into W_in is visible. Singular vectors are defined up to sign,
so each column is compared after aligning its sign with the reference's.
"""

import pytest
import torch
from torch.testing import assert_close

from conftest import perturb_vectors
from glassbox.interp.svd_interpreter import singular_vocab_directions
from glassbox.models import Config, HookedTransformer
from glassbox.tl.SVDInterpreter import SVDInterpreter

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=13, n_layers=2, n_heads=3, d_head=5, d_mlp=19, d_vocab=23, n_ctx=11,
                                     init_range=0.3), dtype=F64).eval()
    perturb_vectors(model)
    return model


def reference(matrix: torch.Tensor, W_U: torch.Tensor, k: int) -> torch.Tensor:
    """Top k right singular vectors of the explicit matrix, through W_U: [d_vocab k]."""
    return (torch.linalg.svd(matrix)[2][:k] @ W_U).T


def assert_equal_up_to_sign(got: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    signs = torch.sign((got * expected).sum(0))
    assert bool((signs != 0).all())
    assert_close(got * signs, expected, atol=atol, rtol=0)


def test_ov_directions_are_the_explicit_ov_circuits_singular_vectors(model):
    W_U = model.W_U.detach()
    for layer in range(2):
        for head in range(3):
            attn = model.blocks[layer].attn
            OV = (attn.W_V[head] @ attn.W_O[head]).detach()  # [d_model d_model], rank d_head
            got = singular_vocab_directions(model, "OV", layer, head, k=5)
            assert got.shape == (23, 5)
            # measured 1.3e-14 (values up to 0.98; the SVD from the factors against the dense one), bound 2e-13: 16x
            assert_equal_up_to_sign(got, reference(OV, W_U, 5), atol=2e-13)


def test_w_in_folds_ln2_weight_and_w_out_is_taken_as_it_is(model):
    W_U = model.W_U.detach()
    mlp, ln2 = model.blocks[1].mlp, model.blocks[1].ln2
    w_in = (mlp.W_in.T * ln2.w).detach()  # the MLP reads (x_normalised * w) @ W_in: w scales W_in's rows
    got = singular_vocab_directions(model, "w_in", 1, k=13)
    # the same torch.linalg.svd call on the same matrix: bit-equal up to sign
    assert_equal_up_to_sign(got, reference(w_in, W_U, 13), atol=0)
    unfolded = reference(mlp.W_in.T.detach(), W_U, 13)
    assert float((got.abs() - unfolded.abs()).abs().max()) > 1e-2  # the fold matters here
    got = singular_vocab_directions(model, "w_out", 0, k=4)
    assert_equal_up_to_sign(got, reference(model.blocks[0].mlp.W_out.detach(), W_U, 4), atol=0)


def test_tl_interpreter_has_transformer_lens_shape_and_the_same_values(model):
    interp = SVDInterpreter(model)
    ov = interp.get_singular_vectors("OV", layer_index=1, num_vectors=3, head_index=2)
    assert ov.shape == (23, 1, 3)
    assert torch.equal(ov[:, 0], singular_vocab_directions(model, "OV", 1, 2, k=3))
    assert interp.get_singular_vectors("w_out", 0).shape == (23, 1, 10)
    assert interp.get_singular_vectors("w_in", 0, head_index=1).shape == (23, 1, 10)  # head ignored, as in TL
    with pytest.raises(AssertionError, match="^Head index optional only for w_in and w_out, got OV$") as error:
        interp.get_singular_vectors("OV", 0)
    assert isinstance(error.value, ValueError)
    with pytest.raises(AssertionError, match="^Layer index must be between 0 and 1 but got 2$"):
        interp.get_singular_vectors("w_in", 2)
    with pytest.raises(AssertionError, match="^Layer index must be between 0 and 1 but got -1$"):
        interp.get_singular_vectors("OV", -1, head_index=0)
    with pytest.raises(AssertionError, match="^Head index must be between 0 and 2 but got 3$"):
        interp.get_singular_vectors("OV", 0, head_index=3)
    with pytest.raises(ValueError, match="Vector type must be in"):
        interp.get_singular_vectors("QK", 0, head_index=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="OV", layer=0, head=None), "needs a head"),
    (dict(kind="OV", layer=2, head=0), "layer must be an int in \\[0, 1\\]"),
    (dict(kind="OV", layer=0, head=3), "head must be an int in \\[0, 2\\]"),
    (dict(kind="OV", layer=0, head=0, k=6), "k must be an int in \\[1, 5\\]"),
    (dict(kind="w_in", layer=0, head=None, k=14), "k must be an int in \\[1, 13\\]"),
    (dict(kind="w_out", layer=0, head=1), "whole layer's MLP"),
    (dict(kind="ov", layer=0, head=0), "kind must be one of"),
])
def test_bad_arguments_are_named(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        singular_vocab_directions(model, **kwargs)


@pytest.mark.parametrize("layout, norm", [(dict(parallel_attn_mlp=True), "ln1"), (dict(norm_placement="post"), None)])
def test_w_in_folds_the_norm_the_mlp_reads(layout, norm):
    """A parallel (GPT-J) block's MLP reads ln1; a post-norm block's MLP reads the raw resid_mid."""
    torch.manual_seed(1)
    model = HookedTransformer(Config(d_model=13, n_layers=1, n_heads=3, d_head=5, d_mlp=19, d_vocab=23, n_ctx=11,
                                     **layout), dtype=F64).eval()
    perturb_vectors(model)
    block = model.blocks[0]
    w_in = block.mlp.W_in.T.detach()
    if norm is not None:
        w_in = w_in * getattr(block, norm).w.detach()
    got = singular_vocab_directions(model, "w_in", 0, k=13)
    assert_equal_up_to_sign(got, reference(w_in, model.W_U.detach(), 13), atol=0)  # the same SVD call
