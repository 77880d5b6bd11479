"""Stacks of the wrong width or shape given to the cache's norm and attribution methods, and a stack with
no component axis (one residual vector per position, TransformerLens's ``[batch d_model]`` with
``pos_slice=-1``).

A stack must end in d_model: a d_mlp-wide stack (neuron activations, not their writes) used to come back
from ``apply_ln_to_stack`` as numbers and reach ``logit_attrs`` as torch's broadcast error. Oracles: the
norm written out by hand from the stream it reads (``F.layer_norm``), and the model's own logits
(``unembed`` of ``ln_final``'s output) for attribution.
"""

import pytest
import torch
import torch.nn.functional as F

from glassbox import Config, HookedTransformer
from glassbox.tl.ActivationCache import ActivationCache as TLCache

# distinct sizes, so a swapped axis cannot pass: d_model 13, d_mlp 19, batch 2, pos 7
CFG = Config(d_model=13, n_layers=2, n_heads=2, d_head=5, d_mlp=19, d_vocab=31, n_ctx=11, init_range=0.2)


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    model = HookedTransformer(CFG).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:  # norm weights off 1, biases off 0: a dropped w or b shows
                noise = torch.randn(param.shape, generator=gen)
                param.copy_((1.0 + 0.3 * noise) if name.endswith(".w") else 0.3 * noise)
    tokens = torch.randint(0, CFG.d_vocab, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return model, logits, cache


def tl_cache(cache):
    return TLCache(dict(cache.cache_dict), cache.model, cache.has_batch_dim, cache.tokens, cache.attention_mask)


# -- wrong widths ---------------------------------------------------------------------------------
@pytest.mark.parametrize("wrap", [lambda c: c, tl_cache], ids=["glassbox", "tl"])
@pytest.mark.parametrize("call", ["apply_ln_to_stack", "apply_ln_to_stack_recompute", "logit_attrs"])
def test_a_stack_of_the_wrong_width_is_refused_naming_both_widths(run, wrap, call):
    model, _, cache = run
    cache = wrap(cache)
    neurons = cache["post", 0][None]  # [1 batch pos d_mlp=19]: activations, not writes to the stream
    with pytest.raises(ValueError, match=r"19 wide.*d_model=13.*d_mlp") as error:
        if call == "apply_ln_to_stack":
            cache.apply_ln_to_stack(neurons)
        elif call == "apply_ln_to_stack_recompute":
            cache.apply_ln_to_stack(neurons, recompute_ln=True)
        else:
            cache.logit_attrs(neurons, 3)
    assert "residual_stack" in str(error.value)
    with pytest.raises(ValueError, match=r"residual_stack .* 12 wide.*d_model=13"):
        cache.apply_ln_to_stack(torch.zeros(3, 2, 7, 12))


@pytest.mark.parametrize("wrap", [lambda c: c, tl_cache], ids=["glassbox", "tl"])
def test_a_stack_whose_leading_axes_fit_neither_form_is_refused_naming_both(run, wrap):
    cache = wrap(run[2])
    # [comp batch=5 pos d_model] against a cache of batch 2: names the stack's axes and the scale's
    with pytest.raises(ValueError, match=r"\(5, 7\).*\(2, 7\).*ln_final.hook_scale"):
        cache.apply_ln_to_stack(torch.zeros(3, 5, 7, 13))
    # a 5-d stack against a [batch pos] scale: neither [comp batch pos d_model] nor [batch pos d_model]
    with pytest.raises(ValueError, match=r"\(4, 3, 2, 7, 13\).*\(2, 7\)"):
        cache.apply_ln_to_stack(torch.zeros(4, 3, 2, 7, 13))
    with pytest.raises(ValueError, match=r"\(3, 13\).*\(3,\).*\(2,\)"):  # [batch d_model], batch 3
        cache.logit_attrs(torch.zeros(3, 13), 4, pos_slice=-1)


# -- no component axis ----------------------------------------------------------------------------
def test_a_stack_without_a_component_axis_is_normalised_per_position(run):
    model, logits, cache = run
    final = cache["resid_post", -1][:, -1]  # [batch d_model]: one stream per sequence, last position
    ln = model.ln_final
    by_hand = F.layer_norm(final, (13,), ln.w.detach(), ln.b.detach(), ln.eps)
    # incl_bias adds b to the single stream, so the whole stream gives the norm's output: measured 1.2e-7
    torch.testing.assert_close(cache.apply_ln_to_stack(final, pos_slice=-1, incl_bias=True), by_hand,
                               atol=2e-6, rtol=0)
    # without it, the linear part: the same as a one-component stack, bit for bit
    linear = cache.apply_ln_to_stack(final, pos_slice=-1)
    assert linear.shape == (2, 13)
    assert torch.equal(linear, cache.apply_ln_to_stack(final[None], pos_slice=-1)[0])
    torch.testing.assert_close(linear + ln.b.detach(), by_hand, atol=2e-6, rtol=0)  # measured 1.2e-7
    # a stack of whole streams with its batch axis cut by batch_slice
    assert torch.equal(cache.apply_ln_to_stack(final[1], pos_slice=-1, batch_slice=1, has_batch_dim=False),
                       cache.apply_ln_to_stack(final[None], pos_slice=-1)[0, 1])
    # every position: [batch pos d_model], measured 4.8e-7
    full = cache["resid_post", -1]
    torch.testing.assert_close(cache.apply_ln_to_stack(full, incl_bias=True),
                               F.layer_norm(full, (13,), ln.w.detach(), ln.b.detach(), ln.eps), atol=5e-6, rtol=0)
    # attribution of the whole stream is the logit itself (glassbox's cache: the bias included); logits up to
    # 2.3, measured 6.0e-8
    targets = torch.tensor([3, 17])
    attrs = cache.logit_attrs(final, targets, pos_slice=-1)
    assert attrs.shape == (2,)
    torch.testing.assert_close(attrs, logits[torch.arange(2), -1, targets], atol=1e-6, rtol=0)
    assert torch.equal(cache.logit_attrs(final, targets, pos_slice=-1, incl_bias=False),
                       cache.logit_attrs(final[None], targets, pos_slice=-1, incl_bias=False)[0])


def test_tl_cache_broadcasts_a_stack_without_a_component_axis(run):
    model, _, cache = run
    ours = tl_cache(cache)
    final = cache["resid_post", -1][:, -1]
    # TransformerLens's contract: centred, divided by the cached scale, no w and b
    scale = cache["ln_final.hook_scale"][:, -1]
    by_hand = (final - final.mean(-1, keepdim=True)) / scale
    # measured 0.0 and 1.2e-7
    torch.testing.assert_close(ours.apply_ln_to_stack(final, layer=-1, pos_slice=-1), by_hand, atol=1e-6, rtol=0)
    directions = model.W_U[:, 3].detach() - model.W_U[:, 5].detach()
    torch.testing.assert_close(ours.logit_attrs(final, 3, 5, pos_slice=-1), by_hand @ directions, atol=2e-6, rtol=0)
