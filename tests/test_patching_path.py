"""Path patching against a hand computation, an identity with activation patching, and a reference
implementation written here with plain full forwards."""

import pytest
import torch

from glassbox.interp.patching import LogitDiff, patch_head_z, path_patch, path_patch_heads
from patching_oracle import SIZES, path_patch_by_forwards, tiny_model

N_PROMPTS, SEQ = 2, 9
METRIC = LogitDiff(torch.tensor([3, 17]), torch.tensor([29, 8]))
ATOL = 1e-5


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(n_layers=4)
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    corrupted = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        _, corrupted_cache = model.run_with_cache(corrupted)
    return model, corrupted, clean_cache, corrupted_cache


def test_frozen_path_to_logits_is_the_senders_direct_effect(setup):
    """With every other head and every MLP frozen, the senders change the final residual stream by
    exactly sum_s (z_clean - z_corrupted)[s] @ W_O[s]; the logits follow by the final norm and W_U."""
    model, corrupted, clean_cache, corrupted_cache = setup
    senders = [(0, 1), (1, 4), (2, 0)]
    final = corrupted_cache["blocks.3.hook_resid_post"].clone()
    for layer, head in senders:
        name = f"blocks.{layer}.attn.hook_z"
        delta = clean_cache[name][:, :, head] - corrupted_cache[name][:, :, head]
        final += delta @ model.blocks[layer].attn.W_O[head]
    with torch.no_grad():
        expected = METRIC(model.unembed(model.ln_final(final))).mean()
    got = path_patch(model, corrupted, clean_cache, METRIC, senders, "logits", freeze_mlps=True)
    assert not got.requires_grad
    # measured 3.0e-7 (values up to 0.97), bound 1e-5: 34x
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    unpatched = METRIC(model(corrupted)).mean()
    assert abs((got - unpatched).item()) > 1000 * ATOL


def test_last_layer_sender_to_logits_equals_activation_patching(setup):
    """Nothing after the last layer's attention but its MLP, recomputed in both: the path is the patch."""
    model, corrupted, clean_cache, _ = setup
    heads = patch_head_z(model, corrupted, clean_cache, METRIC)
    paths = path_patch_heads(model, corrupted, clean_cache, METRIC, "logits")
    # measured 1.2e-7 (values up to 0.9), bound 1e-5: 84x
    torch.testing.assert_close(paths.values[3], heads.values[3], atol=ATOL, rtol=0)
    assert paths.axes == ("layer", "head") and paths.shape == (4, 5)


@pytest.mark.parametrize("senders, receivers", [
    ([(0, 2)], [(2, 1, "q")]),
    ([(0, 0), (1, 3)], [(2, 4, "k"), (3, 0, "v")]),
    ([(1, 1)], [(2, 0, "q"), (2, 0, "k"), (2, 3, "v"), (3, 2, "q")]),
])
def test_paths_into_head_inputs_equal_reference(setup, senders, receivers):
    model, corrupted, clean_cache, _ = setup
    expected = path_patch_by_forwards(model, corrupted, clean_cache, METRIC, senders, receivers)
    got = path_patch(model, corrupted, clean_cache, METRIC, senders, receivers)
    # measured 3.0e-7 (values up to 0.97), bound 1e-5: 34x
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert abs((got - METRIC(model(corrupted)).mean()).item()) > 10 * ATOL  # doing nothing would fail


def test_sweep_over_senders_equals_single_calls_and_marks_impossible_senders(setup):
    model, corrupted, clean_cache, _ = setup
    receivers = [(2, 3, "q")]
    sweep = path_patch_heads(model, corrupted, clean_cache, METRIC, receivers, memory_budget=20_000)
    assert torch.isnan(sweep.values[2:]).all() and not torch.isnan(sweep.values[:2]).any()
    for layer, head in [(0, 0), (0, 4), (1, 2)]:
        single = path_patch(model, corrupted, clean_cache, METRIC, [(layer, head)], receivers)
        # measured 1.8e-7 (values up to 0.87), bound 1e-5: 56x
        torch.testing.assert_close(sweep.values[layer, head], single, atol=ATOL, rtol=0)
    per_prompt = path_patch(model, corrupted, clean_cache, METRIC, [(1, 2)], receivers, reduce=None)
    assert per_prompt.shape == (N_PROMPTS,)


@pytest.mark.parametrize("senders, receivers, message", [
    ([(2, 0)], [(2, 1, "q")], "not in a layer before"),
    ([(0, 5)], "logits", "outside 4 layers x 5 heads"),
    ([(0, 1)], [(2, 1, "z")], "a receiver is"),
    ([(0, 1)], "resid", "'logits' or a list"),
    ([], "logits", "senders is empty"),
])
def test_bad_paths_are_named(setup, senders, receivers, message):
    model, corrupted, clean_cache, _ = setup
    with pytest.raises(ValueError, match=message):
        path_patch(model, corrupted, clean_cache, METRIC, senders, receivers)
    assert not model.has_hooks


def test_layer_0_receivers_are_refused_by_the_sender_sweep(setup):
    """No head precedes a layer-0 receiver; the sweep names it instead of failing on an empty grid."""
    model, corrupted, clean_cache, _ = setup
    with pytest.raises(ValueError, match=r"receiver \(0, 2, 'k'\) is in layer 0: no sender head can precede it"):
        path_patch_heads(model, corrupted, clean_cache, METRIC, [(1, 0, "q"), (0, 2, "k")])
    assert not model.has_hooks
