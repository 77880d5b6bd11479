"""glassbox.tl's patching, head_detector, SVDInterpreter and composition scores against
TransformerLens 3.9 on the same weights (tl_oracle.tl_twin).

Patching runs on a small-vocabulary model (2 layers, 3 heads, d_vocab 97, 6 positions) so that
TransformerLens's one-forward-per-patch loop stays fast; head detection on a GPT-2-vocabulary twin
so both tokenize the same text. Singular vectors are compared up to the sign of each.
"""

import pandas as pd
import pytest
import torch
import transformer_lens
import transformer_lens.head_detector as tl_heads
import transformer_lens.patching as tl_patching
import transformer_lens.utilities as tl_utils
from transformer_lens.FactoredMatrix import FactoredMatrix as TLFactoredMatrix
from transformer_lens.SVDInterpreter import SVDInterpreter as TLSVDInterpreter

from glassbox.interp.composition import all_composition_scores
from glassbox.interp.factored_matrix import FactoredMatrix
from glassbox.models.tokenize import gpt2_tokenizer
from glassbox.tl import head_detector, patching
from glassbox.tl.SVDInterpreter import SVDInterpreter
from glassbox.tl.utils import composition_scores
from tl_oracle import max_diff, tiny_gpt2, tl_twin

N_PROMPTS, POS = 3, 6


@pytest.fixture(scope="module")
def pair():
    model = tiny_gpt2(0, d_vocab=97, n_ctx=16)
    return model, tl_twin(model, tokenizer=gpt2_tokenizer())


@pytest.fixture(scope="module")
def runs(pair):
    model, twin = pair
    generator = torch.Generator().manual_seed(7)
    clean = torch.randint(0, 97, (N_PROMPTS, POS), generator=generator)
    corrupted = torch.randint(0, 97, (N_PROMPTS, POS), generator=generator)
    _, ours = model.run_with_cache(clean)
    _, theirs = twin.run_with_cache(clean)
    return corrupted, ours, theirs


def metric(logits):
    return (logits[:, -1, 5] - logits[:, -1, 11]).mean()


PATCH_FUNCTIONS = [name for name in dir(tl_patching) if name.startswith("get_act_patch_")]


def test_every_transformer_lens_patch_function_is_here():
    assert len(PATCH_FUNCTIONS) == 18
    assert [n for n in PATCH_FUNCTIONS if not hasattr(patching, n)] == []


@pytest.mark.parametrize("name", PATCH_FUNCTIONS)
def test_get_act_patch_equals_transformer_lens(pair, runs, name):
    model, twin = pair
    corrupted, ours, theirs = runs
    expected = getattr(tl_patching, name)(twin, corrupted, theirs, metric)
    got = getattr(patching, name)(model, corrupted, ours, metric)
    assert type(got) is torch.Tensor and got.shape == expected.shape and got.dtype == expected.dtype
    # measured 7.2e-7 over all 18 (values up to 2.0), bound 1e-5: 14x
    assert max_diff(got, expected) < 1e-5, name


def test_generic_patch_with_index_rows_and_index_frames_equal_transformer_lens(pair, runs):
    model, twin = pair
    corrupted, ours, theirs = runs
    rows = pd.DataFrame([[1, 2], [0, 0], [1, -1], [0, 2]], columns=["layer", "head"])
    expected, expected_df = tl_patching.generic_activation_patch(
        twin, corrupted, theirs, metric, tl_patching.layer_head_vector_patch_setter, "z", index_df=rows,
        return_index_df=True)
    got, got_df = patching.generic_activation_patch(model, corrupted, ours, metric,
                                                    patching.layer_head_vector_patch_setter, "z", index_df=rows,
                                                    return_index_df=True)
    assert got.shape == expected.shape == (4,) and got_df is rows and expected_df is rows
    # measured 4.8e-7 (values up to 2.0), bound 5e-6: 10x
    assert max_diff(got, expected) < 5e-6
    names = ["layer", "dest_pos", "head_index"]
    _, expected_df = tl_patching.generic_activation_patch(
        twin, corrupted, theirs, metric, tl_patching.layer_pos_head_vector_patch_setter, "q",
        index_axis_names=names, return_index_df=True)
    got, got_df = patching.generic_activation_patch(model, corrupted, ours, metric,
                                                    patching.layer_pos_head_vector_patch_setter, "q",
                                                    index_axis_names=names, return_index_df=True)
    pd.testing.assert_frame_equal(got_df, expected_df)
    assert tuple(patching.make_df_from_ranges([2, 3], ["a", "b"]).itertuples(index=False)) == \
        tuple(tl_patching.make_df_from_ranges([2, 3], ["a", "b"]).itertuples(index=False))


# -- head detection ---------------------------------------------------------------------------
TEXT = "The cat sat on the mat, and the dog sat on the log. The cat sat on the mat, and the dog sat"
PROMPTS = [TEXT, "one two three four one two three four", "Alice met Bob. Alice met"]


@pytest.fixture(scope="module")
def gpt2_pair():
    model = tiny_gpt2(1, n_ctx=32)
    return model, tl_twin(model)


def assert_scores_match(got, expected, measure):
    assert got.shape == expected.shape and got.dtype == expected.dtype and got.device == expected.device
    # measured 4.5e-8 ("mul", scores up to 0.15) and 6.0e-8 ("abs", -1 to 1), bound 6e-7: 10x
    diff = (got.double() - expected.double()).abs()
    if measure == "mul":
        assert float(diff.max()) < 6e-7
    else:
        # "abs" rounds the distance to 3 decimals: float rounding at a boundary could move a score by
        # one step of 1e-3 (not seen here); anything else must agree as closely as "mul"
        assert bool(((diff < 6e-7) | ((diff - 1e-3).abs() < 6e-7)).all()), diff.max()


@pytest.mark.parametrize("name", tl_heads.HEAD_NAMES)
@pytest.mark.parametrize("measure", ["mul", "abs"])
@pytest.mark.parametrize("exclude", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain", "no-bos", "no-current", "neither"])
def test_detect_head_equals_transformer_lens(gpt2_pair, name, measure, exclude):
    model, twin = gpt2_pair
    options = dict(exclude_bos=exclude[0], exclude_current_token=exclude[1], error_measure=measure)
    assert_scores_match(head_detector.detect_head(model, TEXT, name, **options),
                        tl_heads.detect_head(twin, TEXT, name, **options), measure)


def test_detect_head_heads_lists_dicts_prompt_lists_and_caches_equal_transformer_lens(gpt2_pair):
    model, twin = gpt2_pair
    for heads in ([(0, 1), (1, 2), (1, 0)], {1: [2], 0: [0, 1]}):
        assert_scores_match(head_detector.detect_head(model, TEXT, "induction_head", heads=heads),
                            tl_heads.detect_head(twin, TEXT, "induction_head", heads=heads), "mul")
    for measure in ("mul", "abs"):
        assert_scores_match(head_detector.detect_head(model, PROMPTS, "duplicate_token_head", error_measure=measure),
                            tl_heads.detect_head(twin, PROMPTS, "duplicate_token_head", error_measure=measure),
                            measure)
    tokens = model.to_tokens(TEXT)
    pos = tokens.shape[1]
    custom = torch.tril(torch.rand(pos, pos, generator=torch.Generator().manual_seed(0)) > 0.7).float()
    _, ours = model.run_with_cache(tokens, remove_batch_dim=True)
    _, theirs = twin.run_with_cache(tokens, remove_batch_dim=True)
    for measure in ("mul", "abs"):
        assert_scores_match(head_detector.detect_head(model, TEXT, custom, cache=ours, error_measure=measure,
                                                      exclude_bos=True),
                            tl_heads.detect_head(twin, TEXT, custom, cache=theirs, error_measure=measure,
                                                 exclude_bos=True), measure)


def test_named_detection_patterns_equal_transformer_lens(gpt2_pair):
    model, _ = gpt2_pair
    tokens = model.to_tokens(TEXT)
    for kind in ("previous_token", "duplicate_token", "induction"):
        ours = getattr(head_detector, f"get_{kind}_head_detection_pattern")(tokens)
        theirs = getattr(tl_heads, f"get_{kind}_head_detection_pattern")(tokens)
        assert torch.equal(ours, theirs) and ours.dtype == theirs.dtype, kind


# -- composition scores and SVD interpreter ---------------------------------------------------
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_equal_transformer_lens(pair, mode):
    model, twin = pair
    got, expected = all_composition_scores(model, mode), twin.all_composition_scores(mode)
    assert got.shape == expected.shape
    assert bool((got[expected == 0] == 0).all())  # the same mask: only strictly later layers
    # measured 1.0e-7 (float32 scores up to 0.25), bound 1e-6: 10x
    assert max_diff(got, expected) < 1e-6


@pytest.mark.parametrize("broadcast_dims", [True, False])
def test_composition_scores_of_factored_matrices_equal_transformer_lens(broadcast_dims):
    g = torch.Generator().manual_seed(3)
    A1, B1 = torch.randn(4, 11, 3, generator=g), torch.randn(4, 3, 7, generator=g)
    A2, B2 = torch.randn(4, 7, 5, generator=g), torch.randn(4, 5, 13, generator=g)
    got = composition_scores(FactoredMatrix(A1, B1), FactoredMatrix(A2, B2), broadcast_dims=broadcast_dims)
    expected = tl_utils.composition_scores(TLFactoredMatrix(A1, B1), TLFactoredMatrix(A2, B2),
                                           broadcast_dims=broadcast_dims)
    assert got.shape == expected.shape == ((4, 4) if broadcast_dims else (4,))
    # measured 1.2e-7 (scores up to 0.55), bound 1.5e-6: 12x
    assert max_diff(got, expected) < 1.5e-6


@pytest.mark.parametrize("kind, layer, head, k", [("OV", 1, 2, 8), ("OV", 0, 0, 3), ("w_in", 1, None, 10),
                                                  ("w_out", 0, None, 24)])
def test_svd_interpreter_equals_transformer_lens_up_to_sign(pair, kind, layer, head, k):
    model, twin = pair
    got = SVDInterpreter(model).get_singular_vectors(kind, layer, num_vectors=k, head_index=head)
    expected = TLSVDInterpreter(twin).get_singular_vectors(kind, layer, num_vectors=k, head_index=head)
    assert got.shape == expected.shape == (97, 1, k) and got.dtype == expected.dtype
    signs = torch.sign((got * expected).sum(0, keepdim=True))
    # measured 5.7e-7 (values up to 0.76; OV from two SVD algorithms), bound 6e-6: 10x
    assert max_diff(got * signs, expected) < 6e-6, kind


@pytest.mark.parametrize("args", [dict(vector_type="OV", layer_index=0), dict(vector_type="w_in", layer_index=2),
                                  dict(vector_type="OV", layer_index=-1, head_index=0),
                                  dict(vector_type="OV", layer_index=1, head_index=3),
                                  dict(vector_type="QK", layer_index=0, head_index=0),
                                  dict(vector_type="QK", layer_index=0)])
def test_svd_interpreter_errors_are_transformer_lens_types_and_words(pair, args):
    model, twin = pair
    with pytest.raises(Exception) as theirs:
        TLSVDInterpreter(twin).get_singular_vectors(num_vectors=3, **args)
    with pytest.raises(ValueError) as ours:
        SVDInterpreter(model).get_singular_vectors(num_vectors=3, **args)
    assert isinstance(ours.value, type(theirs.value)) and str(ours.value) == str(theirs.value)


def detect_errors(model, case):
    n = model.cfg.n_ctx
    pos = model.to_tokens(TEXT).shape[-1]
    upper = torch.tril(torch.ones(pos, pos))
    upper[0, 1] = 1.0
    return {
        "empty": dict(seq="", detection_pattern="previous_token_head"),
        "too_long": dict(seq="a " * n, detection_pattern="previous_token_head"),
        "not_square": dict(seq=TEXT, detection_pattern=torch.ones(4, 4)),
        "not_lower": dict(seq=TEXT, detection_pattern=upper),
        "bad_name": dict(seq=TEXT, detection_pattern="test"),
        "bad_measure": dict(seq=TEXT, detection_pattern="induction_head", error_measure="max"),
        "cache_with_list": dict(seq=PROMPTS, detection_pattern="induction_head", cache={}),
    }[case]


@pytest.mark.parametrize("case", ["empty", "too_long", "not_square", "not_lower", "bad_name", "bad_measure",
                                  "cache_with_list"])
def test_detect_head_errors_are_transformer_lens_types_and_words(gpt2_pair, case):
    model, twin = gpt2_pair
    kwargs = detect_errors(model, case)
    with pytest.raises(Exception) as theirs:
        tl_heads.detect_head(twin, **kwargs)
    with pytest.raises(ValueError) as ours:
        head_detector.detect_head(model, **kwargs)
    assert isinstance(ours.value, type(theirs.value)), (type(ours.value).__mro__, type(theirs.value))
    if case in ("not_square", "not_lower"):  # the shapes are printed by each library's own tensor type
        assert str(theirs.value).startswith("The detection pattern must be a lower triangular")
        assert str(ours.value).startswith("The detection pattern must be a lower triangular")
    else:
        assert str(ours.value) == str(theirs.value)


def test_head_detector_type_names_are_transformer_lens_s():
    from typing import get_args

    for name in ("HeadName", "ErrorMeasure"):
        assert get_args(getattr(head_detector, name)) == get_args(getattr(tl_heads, name)), name
    assert tuple(get_args(head_detector.HeadName)) == tuple(tl_heads.HEAD_NAMES) == head_detector.HEAD_NAMES
