"""Stacks without a component axis and of the wrong width: glassbox.tl's ActivationCache against
TransformerLens 3.9's, on the same weights and tokens.

TransformerLens broadcasts a ``[batch d_model]`` stack (one stream per sequence, ``pos_slice=-1``)
against the cached scale, as its Exploratory Analysis demo does; glassbox.tl does the same. A stack whose
last axis is not d_model TransformerLens normalises anyway (a d_mlp-wide one comes back as numbers);
glassbox.tl refuses it, naming both widths.
"""

import pytest
import torch

from glassbox.tl.ActivationCache import ActivationCache
from tl_oracle import max_diff, tiny_model, tl_twin, tokens


@pytest.fixture(scope="module")
def pair():
    model = tiny_model(0)
    twin = tl_twin(model)
    toks = tokens(model, 3, 9)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks)
        _, theirs = twin.run_with_cache(toks)
    ours = ActivationCache(dict(cache.cache_dict), model, cache.has_batch_dim, cache.tokens, cache.attention_mask)
    return model, ours, theirs


def test_a_stack_without_a_component_axis_matches_transformer_lens(pair):
    model, ours, theirs = pair
    # the same stream in both: TransformerLens's own, so only the method differs
    final = theirs["resid_post", -1][:, -1]  # [batch d_model]
    got = ours.apply_ln_to_stack(final, layer=-1, pos_slice=-1)
    want = theirs.apply_ln_to_stack(final, layer=-1, pos_slice=-1)
    assert got.shape == want.shape == (3, 24)
    # the caches' scales come from two forward passes (rounding, 1.6e-6 at most): measured 2.4e-7, values up to 2.4
    assert max_diff(got, want) < 5e-6
    directions = model.W_U[:, 7].detach()
    got_attr = ours.logit_attrs(final, 7, pos_slice=-1)
    want_attr = theirs.logit_attrs(final, 7, pos_slice=-1)
    assert got_attr.shape == want_attr.shape == (3,)
    assert max_diff(got_attr, want_attr) < 2e-6  # measured 6.0e-8
    assert max_diff(got_attr, got @ directions) < 1e-6  # the same dot product: measured 6.0e-8


def test_a_wrong_width_is_refused_where_transformer_lens_returns_numbers(pair):
    model, ours, theirs = pair
    neurons = theirs["post", 0][None]  # [1 batch pos d_mlp=44]
    assert theirs.apply_ln_to_stack(neurons).shape == neurons.shape  # TransformerLens: no error
    with pytest.raises(ValueError, match=r"44 wide.*d_model=24.*d_mlp"):
        ours.apply_ln_to_stack(neurons)
    with pytest.raises(RuntimeError):  # TransformerLens: torch's broadcast error
        theirs.logit_attrs(neurons, 7)
    with pytest.raises(ValueError, match=r"44 wide.*d_model=24"):
        ours.logit_attrs(neurons, 7)


@pytest.mark.parametrize("start", [1, -1, -2])
def test_run_with_cache_from_a_residual_stream_equals_transformer_lens(start):
    import glassbox.tl as gtl

    model = tiny_model(4, n_layers=3)
    twin = tl_twin(model)
    ours = gtl.HookedTransformer.from_glassbox(model, fold_ln=False, center_writing_weights=False,
                                               center_unembed=False, fold_value_biases=False)
    toks = tokens(model, 2, 7)
    with torch.no_grad():
        _, full = twin.run_with_cache(toks)
        resid = full["resid_pre", start % 3]  # TransformerLens's own stream entering that block
        theirs_logits, theirs = twin.run_with_cache(resid, start_at_layer=start)
        our_logits, cache = ours.run_with_cache(resid, start_at_layer=start)
        forward = ours(resid, start_at_layer=start)
    # only the hooks from that block on (glassbox's cache also holds each norm's hook_out and unembed's hooks)
    assert set(theirs.keys()) <= set(cache.keys())
    first = start % 3
    assert all(not k.startswith(("hook_", *(f"blocks.{l}." for l in range(first)))) for k in cache.keys())
    # caching the pattern takes attention off the fused kernel: measured 1.7e-6 (logits up to 4.9)
    assert max_diff(our_logits, forward) < 2e-5
    # the same weights from the same stream: measured 1.7e-6 (logits up to 4.9) and 5.4e-7
    assert max_diff(our_logits, theirs_logits) < 2e-5
    assert max_diff(cache["resid_post", 2], theirs["resid_post", 2]) < 1e-5
