"""Residual-stream analysis against identities that must hold exactly: components sum to the stream,
norms applied to a decomposition sum to the norm's cached output, attributions sum to the logits,
and each head's write equals the attention output with every other head ablated. A norm's output is
computed by hand from the stream it reads (not read from a hook, whose meaning differs between
versions)."""

import pytest
import torch
import torch.nn.functional as F

from glassbox import Config, HookedTransformer
from glassbox.interp import get_last_token_logits

CFG = Config(d_model=15, n_layers=3, n_heads=3, d_head=7, d_mlp=23, d_vocab=29, n_ctx=17)


def randomise_vectors(model, seed: int) -> None:
    """Biases and norm weights start at 0 and 1; make them generic so a dropped term shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
                param.copy_((1.0 + 0.3 * noise) if name.endswith(".w") else 0.3 * noise)


def norm_output(norm, x):
    """The hand computation of a norm's output: F.layer_norm, or x / rms(x) * w for RMSNorm."""
    if type(norm).__name__ == "RMSNorm":
        return x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w.detach()
    return F.layer_norm(x, x.shape[-1:], norm.w.detach(), norm.b.detach(), norm.eps)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = HookedTransformer(CFG).eval()
    randomise_vectors(m, 1)
    return m


@pytest.fixture(scope="module")
def run(model):
    tokens = torch.randint(0, CFG.d_vocab, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return tokens, logits, cache


def test_decompose_resid_sums_to_the_stream(run):
    _, _, cache = run
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out",
                      "2_attn_out", "2_mlp_out"]
    # measured 1.2e-7 (values up to 1.2), bound 1e-5: 84x
    torch.testing.assert_close(stack.sum(0), cache["resid_post", 2], atol=1e-5, rtol=0)
    # measured 0 (values up to 0.6), bound 1e-5 (exact here)
    torch.testing.assert_close(cache.decompose_resid(layer=1).sum(0), cache["resid_pre", 1], atol=1e-5, rtol=0)
    mid, mid_labels = cache.decompose_resid(layer=1, mlp_input=True, return_labels=True)
    assert mid_labels[-1] == "1_attn_out"
    # measured 3.0e-8 (values up to 0.83), bound 1e-5: 336x
    torch.testing.assert_close(mid.sum(0), cache["resid_mid", 1], atol=1e-5, rtol=0)
    attn, attn_labels = cache.decompose_resid(mode="attn", incl_embeds=False, return_labels=True)
    assert attn_labels == ["0_attn_out", "1_attn_out", "2_attn_out"]
    # measured 0 (values up to 0.94), bound 1e-6 (exact here)
    torch.testing.assert_close(attn.sum(0), sum(cache["attn_out", l] for l in range(3)), atol=1e-6, rtol=0)


def test_norm_of_a_decomposition_is_exact_with_the_bias_as_a_component(model, run):
    _, _, cache = run
    final = cache.apply_ln_to_stack(cache.decompose_resid(), incl_bias=True)
    torch.testing.assert_close(final[-1], model.ln_final.b.detach().expand_as(final[-1]), atol=0, rtol=0)
    # measured 4.8e-7 (values up to 2.1), bound 1e-5: 21x
    torch.testing.assert_close(final.sum(0), norm_output(model.ln_final, cache["resid_post", 2]), atol=1e-5, rtol=0)
    for layer in range(3):
        ln1 = cache.apply_ln_to_stack(cache.decompose_resid(layer), layer, incl_bias=True)
        # measured 7.2e-7 (values up to 2.8), bound 1e-5: 14x
        torch.testing.assert_close(ln1.sum(0), norm_output(model.blocks[layer].ln1, cache["resid_pre", layer]), atol=1e-5, rtol=0)
        ln2 = cache.decompose_resid(layer, mlp_input=True, apply_ln=True)
        bias = model.blocks[layer].ln2.b.detach()
        # measured 7.2e-7 (values up to 2.3), bound 1e-5: 14x
        torch.testing.assert_close(ln2.sum(0) + bias, norm_output(model.blocks[layer].ln2, cache["resid_mid", layer]),
                                   atol=1e-5, rtol=0)


def test_accumulated_resid_logit_lens(model, run):
    _, logits, cache = run
    stack, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre", "2_mid", "final_post"]
    torch.testing.assert_close(stack[3], cache["resid_mid", 1], atol=0, rtol=0)
    lens, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels == ["0_pre", "1_pre", "2_pre", "final_post"]
    # measured 4.5e-8 (values up to 0.15), bound 1e-5: 224x
    torch.testing.assert_close(lens[-1] @ model.W_U, logits, atol=1e-5, rtol=0)
    # At an inner layer, apply_ln is that layer's ln1 on each stream: its last row is ln1's output.
    inner = cache.accumulated_resid(layer=2, apply_ln=True)
    # measured 4.8e-7 (values up to 2.6), bound 1e-5: 21x
    torch.testing.assert_close(inner[-1], norm_output(model.blocks[2].ln1, cache["resid_pre", 2]), atol=1e-5, rtol=0)
    assert cache.accumulated_resid(layer=1, mlp_input=True, return_labels=True)[1] == ["0_pre", "1_pre", "1_mid"]


def test_stack_head_results_matches_single_head_ablation(model, run):
    tokens, _, cache = run
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{l}H{h}" for l in range(3) for h in range(3)] and stack.shape == (9, 2, 9, 15)
    for l in range(3):
        b_O = model.blocks[l].attn.b_O.detach()
        # measured 3.0e-8 (values up to 0.68), bound 1e-5: 336x
        torch.testing.assert_close(stack[3 * l: 3 * l + 3].sum(0) + b_O, cache["attn_out", l], atol=1e-5, rtol=0)
    with_bias, labels = cache.stack_head_results(layer=2, incl_b_O=True, return_labels=True)
    assert labels == ["L0H0", "L0H1", "L0H2", "L0_b_O", "L1H0", "L1H1", "L1H2", "L1_b_O"]
    # measured 3.0e-8 (values up to 0.58), bound 1e-5: 336x
    torch.testing.assert_close(with_bias[4:].sum(0), cache["attn_out", 1], atol=1e-5, rtol=0)
    # Oracle: keep only head h's z (upstream untouched, as patching hook_z changes nothing before it).
    for l, h in [(0, 2), (2, 1)]:
        def only(z, hook, h=h):
            kept = torch.zeros_like(z)
            kept[:, :, h] = z[:, :, h]
            return kept

        with torch.no_grad():
            with model.hooks([(f"blocks.{l}.attn.hook_z", only)]):
                _, ablated = model.run_with_cache(tokens, names_filter=f"blocks.{l}.hook_attn_out")
        expected = ablated["attn_out", l] - model.blocks[l].attn.b_O.detach()
        # measured 3.0e-8 (values up to 0.0032), bound 1e-6: 34x
        torch.testing.assert_close(stack[3 * l + h], expected, atol=1e-6, rtol=0)


def test_logit_attrs_sum_to_logits_at_every_position(model, run):
    tokens, logits, cache = run
    stack = cache.decompose_resid()
    targets = torch.randint(0, CFG.d_vocab, tokens.shape, generator=torch.Generator().manual_seed(3))
    attrs = cache.logit_attrs(stack, targets)
    assert attrs.shape == (9, 2, 9)  # 8 components + the final norm's bias
    # measured 3.4e-8 (values up to 0.13), bound 1e-5: 298x
    torch.testing.assert_close(attrs.sum(0), logits.gather(-1, targets[..., None])[..., 0], atol=1e-5, rtol=0)
    one = cache.logit_attrs(stack, 4, incl_bias=False)
    assert one.shape == (8, 2, 9)
    # measured 1.1e-8 (values up to 0.053), bound 1e-5: 895x
    torch.testing.assert_close(one, attrs_for(cache, stack, 4), atol=1e-5, rtol=0)


def attrs_for(cache, stack, token: int):
    """Hand computation of the un-biased attribution to one token."""
    model = cache.model
    centred = stack - stack.mean(-1, keepdim=True)
    return (centred / cache["ln_final.hook_scale"] * model.ln_final.w.detach()) @ model.W_U.detach()[:, token]


def test_logit_difference_at_the_last_real_token_of_a_padded_batch(model):
    tokens = torch.randint(0, CFG.d_vocab, (3, 8), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[0, 5:] = False  # right padded
    mask[2, :3] = False  # left padded
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    right, wrong = torch.tensor([1, 2, 3]), torch.tensor([7, 11, 13])
    stack = cache.decompose_resid(pos_slice="last")
    assert stack.shape == (8, 3, 15)
    attrs = cache.logit_attrs(stack, right, wrong, pos_slice="last")
    last = get_last_token_logits(logits, mask)
    expected = last.gather(-1, right[:, None])[:, 0] - last.gather(-1, wrong[:, None])[:, 0]
    # measured 6.0e-8 (values up to 0.77), bound 1e-5: 168x
    torch.testing.assert_close(attrs.sum(0), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(last[0], logits[0, 4], atol=0, rtol=0)
    with pytest.raises(ValueError, match="pos_slice"):
        cache.logit_attrs(stack, right)  # stack cut at one position, scale not


def test_gpt2_small_shape_attribution_is_exact(small_model):
    """The proof at GPT-2-small size (the suite's shared random model, norms and biases perturbed):
    heads, b_O, MLPs, embeddings and the final norm's bias attribute the logit difference at the last
    token to within 1e-4."""
    model = small_model
    assert model.cfg.d_model == 768 and model.cfg.n_layers == 12 and model.cfg.d_vocab == 50257
    tokens = torch.randint(0, 50257, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        right, wrong = torch.tensor([464, 3290]), torch.tensor([286, 11])
        expected = logits[:, -1, right].diagonal() - logits[:, -1, wrong].diagonal()
        whole = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), right, wrong, pos_slice=-1)
        heads = cache.stack_head_results(incl_b_O=True, pos_slice=-1)
        mlps = torch.stack([cache["mlp_out", l][:, -1] for l in range(12)])
        embeds = torch.stack([cache["hook_embed"][:, -1], cache["hook_pos_embed"][:, -1]])
        fine = cache.logit_attrs(torch.cat([embeds, heads, mlps]), right, wrong, pos_slice=-1)
    assert whole.shape == (2 + 24 + 1, 2) and fine.shape == (2 + 12 * 13 + 12 + 1, 2)
    assert float(expected.abs().min()) > 1e-3  # a difference worth attributing
    assert float(whole[-1].abs().min()) > 1e-3  # the final norm's bias matters here
    # measured 3.0e-7 (values up to 1.2), bound 0.0001: 336x
    torch.testing.assert_close(whole.sum(0), expected, atol=1e-4, rtol=0)
    # measured 4.8e-7 (values up to 1.2), bound 0.0001: 210x
    torch.testing.assert_close(fine.sum(0), expected, atol=1e-4, rtol=0)


def test_rms_norm_attribution_is_exact():
    torch.manual_seed(8)
    rms = HookedTransformer(CFG.replace(normalization="RMS", n_layers=2)).eval()
    randomise_vectors(rms, 9)
    tokens = torch.randint(0, CFG.d_vocab, (2, 6), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        logits, cache = rms.run_with_cache(tokens)
    stack = cache.apply_ln_to_stack(cache.decompose_resid(), incl_bias=True)
    assert float(stack[-1].abs().max()) == 0.0  # RMSNorm has no bias
    # measured 4.8e-7 (values up to 2.6), bound 1e-5: 21x
    torch.testing.assert_close(stack.sum(0), norm_output(rms.ln_final, cache["resid_post", 1]), atol=1e-5, rtol=0)
    attrs = cache.logit_attrs(cache.decompose_resid(), tokens)
    # measured 3.0e-8 (values up to 0.14), bound 1e-5: 336x
    torch.testing.assert_close(attrs.sum(0), logits.gather(-1, tokens[..., None])[..., 0], atol=1e-5, rtol=0)


def test_errors_name_the_problem(model, run):
    tokens, _, cache = run
    _, partial = model.run_with_cache(tokens, names_filter=lambda n: "resid" in n or n == "hook_embed")
    with pytest.raises(KeyError, match="hook_z"):
        partial.stack_head_results()
    with pytest.raises(ValueError, match="mode"):
        cache.decompose_resid(mode="heads")
    with pytest.raises(ValueError, match="layer=7"):
        cache.accumulated_resid(layer=7)
    with pytest.raises(ValueError, match="tokens of shape"):
        cache.logit_attrs(cache.decompose_resid(), torch.zeros(5, dtype=torch.long))
    post = HookedTransformer(CFG.replace(norm_placement="post", n_layers=1))
    _, post_cache = post.run_with_cache(tokens)
    with pytest.raises(ValueError, match="post-norm"):
        post_cache.decompose_resid()


def test_an_unembedding_bias_joins_the_bias_row():
    torch.manual_seed(11)
    untied = HookedTransformer(CFG.replace(n_layers=1, tied_unembed=False, unembed_bias=True)).eval()
    randomise_vectors(untied, 12)
    tokens = torch.randint(0, CFG.d_vocab, (2, 6), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        logits, cache = untied.run_with_cache(tokens)
    wrong = (tokens + 1) % CFG.d_vocab
    attrs = cache.logit_attrs(cache.decompose_resid(), tokens, wrong)
    expected = logits.gather(-1, tokens[..., None])[..., 0] - logits.gather(-1, wrong[..., None])[..., 0]
    # measured 6.0e-8 (values up to 0.77), bound 1e-5: 168x
    torch.testing.assert_close(attrs.sum(0), expected, atol=1e-5, rtol=0)
    b_U = untied.unembed.b_U.detach()
    without_b_U = cache.logit_attrs(cache.decompose_resid(), tokens, wrong)[-1] - (b_U[tokens] - b_U[wrong])
    W_U = untied.W_U.detach()
    ln_b = torch.einsum("d,dbp->bp", untied.ln_final.b.detach(), W_U[:, tokens] - W_U[:, wrong])
    # measured 3.4e-8 (values up to 0.078), bound 1e-5: 298x
    torch.testing.assert_close(without_b_U, ln_b, atol=1e-5, rtol=0)
