"""The explicit attention path's blocked causal scores (attention.causal_scores), against the one full
masked product q @ k^T and against the model's fused path."""

import pytest
import torch

from glassbox import Config, HookedTransformer
from glassbox.models.attention import CAUSAL_BLOCK, causal_scores, causal_mask


def full_scores(q, k):
    n = q.shape[-2]
    return (q @ k.transpose(-1, -2)).masked_fill_(~causal_mask(n, n, q.device), float("-inf"))


def assert_close_scores(got, want, bound):
    """The same -inf entries; the finite ones within ``bound``."""
    assert got.shape == want.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    assert (got - want).nan_to_num(neginf=0.0).abs().max() <= bound


@pytest.mark.parametrize("n", [2 * CAUSAL_BLOCK, 2 * CAUSAL_BLOCK + 37, 3 * CAUSAL_BLOCK + 1])
def test_blocked_scores_equal_the_full_masked_product(n):
    g = torch.Generator().manual_seed(n)
    q, k = torch.randn(2, 3, n, 16, generator=g), torch.randn(2, 3, n, 16, generator=g)
    got = causal_scores(q, k, causal_mask(n, n, q.device))
    assert got.shape == (2, 3, n, n)
    # a GEMM's tail kernels may sum a row in another order: measured 2.9e-6 (values up to 25), bound 3e-5: 10x
    assert_close_scores(got, full_scores(q, k), 3e-5)
    assert torch.isneginf(got).sum() == 2 * 3 * n * (n - 1) // 2  # exactly the strict upper triangle


def test_blocked_scores_broadcast_grouped_keys():
    n = 2 * CAUSAL_BLOCK + 5
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(1, 2, 3, n, 8, generator=g), torch.randn(1, 2, 1, n, 8, generator=g)  # [b kv group pos d]
    got = causal_scores(q, k, causal_mask(n, n, q.device))
    # measured 9.5e-7 (values up to 17), bound 1e-5: 10x
    assert_close_scores(got, full_scores(q, k), 1e-5)


def test_blocked_scores_gpt2_head_size_bit_equal():
    """GPT-2's d_head 64 at 1024 positions, the benchmarked shape (equal bits on this machine)."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 4, 1024, 64, generator=g), torch.randn(1, 4, 1024, 64, generator=g)
    got = causal_scores(q, k, causal_mask(1024, 1024, q.device))
    # measured 0 (values up to 46), bound 5e-5 so another GEMM kernel's rounding passes: 1 ulp is 3.8e-6
    assert_close_scores(got, full_scores(q, k), 5e-5)


def tiny_long_model():
    torch.manual_seed(3)
    return HookedTransformer(Config(d_model=24, n_layers=2, n_heads=3, d_vocab=53, n_ctx=3 * CAUSAL_BLOCK)).eval()


def test_cached_scores_and_logits_with_the_blocked_path():
    model = tiny_long_model()
    x = torch.randint(0, 53, (2, 3 * CAUSAL_BLOCK - 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fused = model(x)  # no hook: scaled_dot_product_attention
        logits, cache = model.run_with_cache(x)  # every hook: the explicit path, blocked scores
    # measured 1.5e-7 (logits up to 0.54), bound 2e-6: 13x
    assert (logits - fused).abs().max() < 2e-6
    for layer in range(2):
        q, k = cache[f"blocks.{layer}.attn.hook_q"], cache[f"blocks.{layer}.attn.hook_k"]
        want = full_scores(q.transpose(1, 2) * model.blocks[layer].attn.scale, k.transpose(1, 2))
        # measured 0 (scores up to 0.064, 1 ulp 7.5e-9), bound 1e-7
        assert_close_scores(cache[f"blocks.{layer}.attn.hook_attn_scores"], want, 1e-7)


def test_grad_path_keeps_the_full_product():
    model = tiny_long_model()
    x = torch.randint(0, 53, (1, 2 * CAUSAL_BLOCK), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        _, want = model.run_with_cache(x, names_filter=lambda name: name.endswith("hook_attn_scores"))
    seen = {}
    hook = lambda act, hook: seen.__setitem__(hook.name, act.detach())  # noqa: E731
    logits = model.run_with_hooks(x, fwd_hooks=[(lambda name: name.endswith("hook_attn_scores"), hook)])
    assert logits.requires_grad  # gradients flow: causal_scores' out= was not used
    assert set(seen) == set(want)
    for name, value in seen.items():
        # the same dot products, blocked or not: measured 0 (scores up to 0.07, 1 ulp 7.5e-9), bound 1e-7
        assert_close_scores(value, want[name], 1e-7)
