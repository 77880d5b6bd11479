"""Hook lifecycle: identity, ablation, cleanup on errors, nesting, prepend order, backward hooks."""

import pytest
import torch

from glassbox.hooks import HookedRootModule


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens)


# Hooking these points switches attention to its explicit kernel (the pattern materialised); every
# other hook point, the norms' hook_scale and hook_normalized included (computed on the side, the output
# still the fused kernel's), leaves the computation exactly as it was (tests/test_capture_exact.py).
PATH_SWITCHING = ("hook_attn_scores", "hook_pattern")


def test_identity_hook_is_bit_identical(tiny_model, tiny_tokens):
    clean = logits(tiny_model, tiny_tokens)
    with tiny_model.hooks(fwd_hooks=[(lambda name: not name.endswith(PATH_SWITCHING), lambda x, hook: x)]):
        hooked = logits(tiny_model, tiny_tokens)
    assert torch.equal(clean, hooked)


def test_identity_hook_everywhere_changes_nothing_beyond_rounding(tiny_model, tiny_tokens):
    clean = logits(tiny_model, tiny_tokens)
    with tiny_model.hooks(fwd_hooks=[(lambda name: True, lambda x, hook: x)]):
        hooked = logits(tiny_model, tiny_tokens)
    # measured 3.0e-8 (values up to 0.21), bound 1e-6: 34x
    torch.testing.assert_close(hooked, clean, atol=1e-6, rtol=0)
    # And the explicit path is itself deterministic: hooking twice gives the same bits.
    with tiny_model.hooks(fwd_hooks=[(lambda name: True, lambda x, hook: None)]):
        assert torch.equal(logits(tiny_model, tiny_tokens), hooked)


def test_zero_ablation_changes_logits(tiny_model, tiny_tokens):
    clean = logits(tiny_model, tiny_tokens)
    with tiny_model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook: torch.zeros_like(x))]):
        ablated = logits(tiny_model, tiny_tokens)
    assert (clean - ablated).abs().max() > 1e-3


def test_raising_hook_leaves_no_hook_and_clean_forward(tiny_model, tiny_tokens):
    clean = logits(tiny_model, tiny_tokens)

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.1.hook_resid_mid", boom),
                                                          ("blocks.0.hook_resid_pre", lambda x, hook: x * 2)])
    assert not tiny_model.has_hooks
    assert torch.equal(logits(tiny_model, tiny_tokens), clean)
    with pytest.raises(RuntimeError, match="boom"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.1.hook_resid_mid", boom)], reset_hooks_end=False)
    assert not tiny_model.has_hooks


def test_context_removes_exactly_its_own_hooks_and_nests(tiny_model, tiny_tokens):
    calls = []
    kept = tiny_model.add_hook("hook_embed", lambda x, hook: calls.append("kept"))
    try:
        with tiny_model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append("outer"))]):
            with pytest.raises(ValueError):
                with tiny_model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append("inner"))]):
                    logits(tiny_model, tiny_tokens)
                    raise ValueError("body fails")
            assert calls == ["kept", "outer", "inner"]
            calls.clear()
            logits(tiny_model, tiny_tokens)
            assert calls == ["kept", "outer"]
        calls.clear()
        logits(tiny_model, tiny_tokens)
        assert calls == ["kept"]
    finally:
        for handle in kept:
            handle.remove()
    assert not tiny_model.has_hooks


def test_prepend_runs_first(tiny_model, tiny_tokens):
    order = []
    try:
        tiny_model.add_hook("hook_pos_embed", lambda x, hook: order.append("a"))
        tiny_model.add_hook("hook_pos_embed", lambda x, hook: order.append("b"), prepend=True)
        logits(tiny_model, tiny_tokens)
    finally:
        tiny_model.reset_hooks()
    assert order == ["b", "a"]


def test_replacing_with_wrong_shape_names_hook_and_shapes(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.hook_z.*\(3, 11, 2, 5\).*\(3, 11, 3, 5\)"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.1.attn.hook_z", lambda x, hook: x[:, :, :2])])
    with pytest.raises(ValueError, match="hook_embed.*float64"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", lambda x, hook: x.double())])
    assert not tiny_model.has_hooks


def test_unknown_name_lists_closest(tiny_model):
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        tiny_model.add_hook("blocks.0.attn.hook_patern", lambda x, hook: None)
    assert not tiny_model.has_hooks


def test_filter_matches_every_name(tiny_model, tiny_tokens):
    seen = []
    tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[(lambda name: name.endswith("hook_q"), lambda x, hook: seen.append(hook.name))])
    assert seen == ["blocks.0.attn.hook_q", "blocks.1.attn.hook_q"]


def test_backward_hook_sees_autograd_gradient_and_can_replace_it(tiny_model, tiny_tokens):
    name = "blocks.1.hook_resid_pre"
    saved, grads = {}, {}

    def keep(x, hook):
        x.retain_grad()
        saved["act"] = x

    with tiny_model.hooks(fwd_hooks=[(name, keep)], bwd_hooks=[(name, lambda g, hook: grads.__setitem__("g", g.clone()))]):
        tiny_model.zero_grad()
        tiny_model(tiny_tokens, return_type="loss").backward()
    torch.testing.assert_close(grads["g"], saved["act"].grad, atol=0, rtol=0)
    assert grads["g"].abs().max() > 0
    w = tiny_model.embed.W_E
    w_grad_plain = w.grad.clone()
    # Zeroing the gradient at resid_pre of layer 1 must change what reaches the embedding.
    with tiny_model.hooks(bwd_hooks=[(name, lambda g, hook: torch.zeros_like(g))]):
        tiny_model.zero_grad()
        tiny_model(tiny_tokens, return_type="loss").backward()
    assert not torch.allclose(w.grad, w_grad_plain)
    zeroed = w.grad.clone()
    # torch's module-hook form (grad,), which TransformerLens code returns, is the same replacement
    with tiny_model.hooks(bwd_hooks=[(name, lambda g, hook: (torch.zeros_like(g),))]):
        tiny_model.zero_grad()
        tiny_model(tiny_tokens, return_type="loss").backward()
    assert torch.equal(w.grad, zeroed)
    with pytest.raises(TypeError, match=r"returned tuple; return a Tensor or None \(or a backward hook's \(grad,\)\)"):
        with tiny_model.hooks(bwd_hooks=[(name, lambda g, hook: (g, g))]):
            tiny_model(tiny_tokens, return_type="loss").backward()
    tiny_model.zero_grad(set_to_none=True)
    assert not tiny_model.has_hooks


def test_hook_dict_names_every_hook_point(tiny_model):
    assert isinstance(tiny_model, HookedRootModule)
    for name, point in tiny_model.hook_dict.items():
        assert point.name == name
    assert "blocks.1.mlp.hook_post" in tiny_model.hook_dict
