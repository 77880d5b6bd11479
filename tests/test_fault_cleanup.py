"""Faults leave nothing behind: a hook, a metric or a KeyboardInterrupt that raises in the middle of a
cache run, a generation or a patching sweep leaves the model exactly as it was.

"Exactly as it was" is checked, not assumed: the SHA-256 of every tensor of the state dict (bytes,
dtype and shape), the hooks at every hook point (the same functions, in the same order: a user's
own hooks stay, the operation's are gone), every hook point's ``ctx``, each parameter's
``requires_grad`` and ``.grad``, the train/eval mode, torch's grad mode, and the logits of a fresh
forward, bit for bit.
"""

import hashlib

import pytest
import torch

from conftest import TINY

V = TINY["vocab_size"]


class Boom(Exception):
    pass


def fingerprint(model) -> dict:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes())
    return {
        "weights": digest.hexdigest(),
        "hooks": {name: (list(p.fwd_hooks), list(p.bwd_hooks)) for name, p in model.hook_dict.items()},
        "ctx": {name: dict(p.ctx) for name, p in model.hook_dict.items()},
        "grad": {name: (p.requires_grad, None if p.grad is None else p.grad.clone()) for name, p in model.named_parameters()},
        "training": model.training,
        "grad_mode": torch.is_grad_enabled(),
    }


def assert_untouched(model, before: dict, tokens, logits_before) -> None:
    after = fingerprint(model)
    assert after["weights"] == before["weights"], "weights changed"
    changed = [n for n in before["hooks"] if after["hooks"][n] != before["hooks"][n]]
    assert not changed, f"hooks left behind or lost at {changed[:3]}"
    assert after["ctx"] == before["ctx"], "hook ctx left behind"
    assert after["training"] == before["training"]
    assert after["grad_mode"] == before["grad_mode"], "torch's grad mode was left changed"
    for name, (requires, grad) in before["grad"].items():
        assert after["grad"][name][0] == requires, f"{name}.requires_grad changed"
        assert (after["grad"][name][1] is None) == (grad is None), f"{name}.grad appeared or vanished"
    with torch.no_grad():
        assert torch.equal(model(tokens), logits_before), "a fresh forward gives other logits"


@pytest.fixture
def snapshot(tiny_model, tiny_tokens):
    with torch.no_grad():
        logits = tiny_model(tiny_tokens)
    assert not tiny_model.has_hooks
    return fingerprint(tiny_model), logits


def raise_at(layer_name: str, exc=Boom):
    def hook(act, hook):
        raise exc(f"raised at {hook.name}")
    return layer_name, hook


# -- cache runs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_hook_raising_mid_cache_run(tiny_model, tiny_tokens, snapshot, exc):
    with pytest.raises(exc):
        with tiny_model.hooks([raise_at("blocks.1.attn.hook_pattern", exc)]):
            tiny_model.run_with_cache(tiny_tokens)
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


def test_users_own_hook_survives_a_failed_cache_run(tiny_model, tiny_tokens, snapshot):
    """A hook added with add_hook is the user's to remove: a failed cache run removes only its own."""
    seen = []
    handles = tiny_model.add_hook("blocks.0.hook_resid_pre", lambda act, hook: seen.append(1))
    with_user_hook = fingerprint(tiny_model)
    try:
        with pytest.raises(Boom):
            with tiny_model.hooks([raise_at("blocks.1.mlp.hook_post")]):
                tiny_model.run_with_cache(tiny_tokens, names_filter=lambda n: "resid" in n)
        assert seen == [1]
        after = fingerprint(tiny_model)
        assert after["hooks"] == with_user_hook["hooks"] and after["weights"] == with_user_hook["weights"]
    finally:
        for handle in handles:
            handle.remove()
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_backward_hook_raising_mid_gradient_cache(tiny_model, tiny_tokens, snapshot, exc):
    def bwd(grad, hook):
        raise exc("backward")

    with pytest.raises(exc):
        with tiny_model.hooks(bwd_hooks=[("blocks.0.hook_resid_mid", bwd)]):
            tiny_model.run_with_cache(tiny_tokens, incl_bwd=True)
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


# -- generation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("use_past_kv_cache", [True, False])
def test_hook_raising_at_a_later_generation_step(tiny_model, tiny_tokens, snapshot, exc, use_past_kv_cache):
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    steps = []

    def at_step_2(act, hook):
        steps.append(hook.ctx["step"])
        if hook.ctx["step"] == 2:
            raise exc("step 2")

    with pytest.raises(exc):
        with tiny_model.hooks([("blocks.1.hook_mlp_out", at_step_2)]):
            tiny_model.generate(prompt, max_new_tokens=5, eos_token_id=None, use_past_kv_cache=use_past_kv_cache)
    assert steps == [0, 1, 2], "the fault was meant to come mid-generation"
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


# -- patching sweeps ------------------------------------------------------------------------------
def sweep_inputs(model):
    clean = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(7))
    corrupted = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(8))
    _, cache = model.run_with_cache(clean)
    return corrupted, cache


def logit_diff(logits):
    return logits[:, -1, 3] - logits[:, -1, 5]


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_metric_raising_mid_sweep(tiny_model, tiny_tokens, snapshot, exc):
    from glassbox.interp.patching import patch_resid_pre

    corrupted, cache = sweep_inputs(tiny_model)
    calls = []

    def metric(logits):
        calls.append(1)
        if len(calls) == 3:
            raise exc("metric")
        return logit_diff(logits)

    # A tiny memory budget splits the sweep into many chunks, so the third call is mid-sweep.
    with pytest.raises(exc):
        patch_resid_pre(tiny_model, corrupted, cache, metric, memory_budget=1)
    assert len(calls) == 3
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("sweep", ["patch_resid_pre", "patch_head_z", "patch_head_pattern", "patch_head_pattern_by_pos"])
def test_hook_raising_mid_sweep(tiny_model, tiny_tokens, snapshot, exc, sweep):
    import glassbox.interp.patching as patching

    corrupted, cache = sweep_inputs(tiny_model)
    seen = []

    def third_time(act, hook):
        seen.append(1)
        if len(seen) == 3:
            raise exc("hook")

    with pytest.raises(exc):
        with tiny_model.hooks([("blocks.1.hook_mlp_out", third_time)]):
            getattr(patching, sweep)(tiny_model, corrupted, cache, logit_diff, memory_budget=1)
    assert len(seen) == 3
    assert_untouched(tiny_model, snapshot[0], tiny_tokens, snapshot[1])


def test_interrupted_sweep_then_a_full_sweep_gives_the_uninterrupted_result(tiny_model):
    """After an interrupt the model is not just clean by inspection: a sweep run again equals one
    run on a model that was never interrupted (a fresh copy)."""
    from glassbox.interp.patching import patch_resid_pre
    from glassbox.models import HookedTransformer

    corrupted, cache = sweep_inputs(tiny_model)
    fresh = HookedTransformer(tiny_model.cfg, init=False)
    fresh.load_state_dict(tiny_model.state_dict())
    expected = patch_resid_pre(fresh.eval(), corrupted, cache, logit_diff).values

    def interrupt(logits):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        patch_resid_pre(tiny_model, corrupted, cache, interrupt)
    torch.testing.assert_close(patch_resid_pre(tiny_model, corrupted, cache, logit_diff).values, expected,
                               atol=0, rtol=0)


def test_stop_at_layer_with_a_key_value_cache_reads_the_cache_and_leaves_it(tiny_model, tiny_tokens):
    """Stopping early runs only the first layers: the cache is read (positions and keys of the past),
    not extended, so it stays usable."""
    from glassbox.models.kv_cache import KVCache

    kv = KVCache(tiny_model.cfg.n_layers)
    with torch.no_grad():
        tiny_model(tiny_tokens[:, :4], past_kv_cache=kv)
        partial = tiny_model(tiny_tokens[:, 4:6], past_kv_cache=kv, stop_at_layer=1)
        assert [layer.length for layer in kv.layers] == [4] * tiny_model.cfg.n_layers
        # measured 1.2e-7 (values up to 0.98), bound 1e-6: 8x
        torch.testing.assert_close(partial, tiny_model(tiny_tokens[:, :6], stop_at_layer=1)[:, 4:], atol=1e-6, rtol=0)
        full = tiny_model(tiny_tokens[:, :6])[:, 4:]
        # the cache still works: measured 5.2e-8 (logits up to 0.21), bound 1e-6: 19x
        torch.testing.assert_close(tiny_model(tiny_tokens[:, 4:6], past_kv_cache=kv), full, atol=1e-6, rtol=0)
