"""A torch module hook on a hook point (``register_forward_hook``, or a global module hook) sees the
point's value: the fused paths that skip an unhooked point (attention's kernel, which never materialises
the pattern; a norm's fused scale) must not skip a point torch hooks. Oracle: transformers' attentions."""

import torch
from torch import nn

from conftest import TINY, make_hf_gpt2
from glassbox import HookedTransformer


def _model_and_tokens():
    hf = make_hf_gpt2(seed=3, **TINY)
    tokens = torch.randint(0, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(4))
    return hf, HookedTransformer.from_hf(hf), tokens


def test_register_forward_hook_on_hook_pattern_fires_with_the_pattern():
    hf, model, tokens = _model_and_tokens()
    seen = {}
    handles = [model.hook_dict[f"blocks.{L}.attn.hook_pattern"].register_forward_hook(
        lambda mod, args, out, L=L: seen.__setitem__(L, out.detach().clone())) for L in range(model.cfg.n_layers)]
    try:
        with torch.no_grad():
            model(tokens)
            expected = hf(tokens, output_attentions=True).attentions
    finally:
        for h in handles:
            h.remove()
    assert sorted(seen) == list(range(model.cfg.n_layers))  # before the fix: {} (the fused kernel ran)
    for L in range(model.cfg.n_layers):
        # measured <= 6e-8 (probabilities); bound 2e-6
        torch.testing.assert_close(seen[L], expected[L], atol=2e-6, rtol=0)
    assert not model.hook_dict["blocks.0.attn.hook_pattern"].has_hooks  # removing the handle turns the fast path back on


def test_a_global_module_hook_sees_every_hook_point():
    _, model, tokens = _model_and_tokens()
    names = []
    point_names = {id(p): n for n, p in model.hook_dict.items()}
    handle = nn.modules.module.register_module_forward_hook(
        lambda mod, args, out: names.append(point_names[id(mod)]) if id(mod) in point_names else None)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    assert "blocks.1.attn.hook_pattern" in names and "blocks.0.ln1.hook_scale" in names
    assert not model.has_hooks


def test_torch_hook_replacing_the_pattern_changes_the_output_as_an_add_hook_does():
    _, model, tokens = _model_and_tokens()
    point = model.hook_dict["blocks.0.attn.hook_pattern"]
    def first(x):  # every query attends to position 0 only
        out = torch.zeros_like(x)
        out[..., 0] = 1
        return out
    with torch.no_grad():
        base = model(tokens)
        handle = point.register_forward_hook(lambda mod, args, out: first(out))
        try:
            by_torch = model(tokens)
        finally:
            handle.remove()
        by_glassbox = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern",
                                                               lambda x, hook: first(x))])
    assert (by_torch - base).abs().max() > 1e-4  # the replacement took effect (measured 8e-4; logits ~0.1)
    torch.testing.assert_close(by_torch, by_glassbox, atol=0, rtol=0)
