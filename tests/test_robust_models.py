"""Robustness of the model and hook layers: threads, empty losses, flag types, start_at_layer targets,
nested hooks of one function, KV caches after a fault, numpy and unsigned ids, devices of hook
results, and rotary tables sized by use.

Each test states its oracle: a hand computation, the model's own unfaulted run, or the tables as
they were built before (eagerly, for all n_ctx rows).
"""

import copy
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from jaxtyping import TypeCheckError

from conftest import TINY
from glassbox.models import Config, HookedTransformer, KVCache, preset_config

V = TINY["vocab_size"]
WAIT = 20  # seconds; a deadlock fails the test instead of hanging it


def run_thread(target) -> dict:
    """Start ``target`` on a thread; the returned dict gets its "result" or "error"."""
    out: dict = {}

    def body():
        try:
            out["result"] = target()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            out["error"] = err

    out["thread"] = threading.Thread(target=body, name="worker")
    out["thread"].start()
    return out


def finish(out: dict):
    out["thread"].join(WAIT)
    assert not out["thread"].is_alive(), "the worker thread did not finish"
    return out


# -- 1. one model, two threads ------------------------------------------------------------------
def test_forward_on_another_thread_while_hooks_are_held_is_refused(tiny_model, tiny_tokens):
    with torch.no_grad():
        clean = tiny_model(tiny_tokens)
    held, done = threading.Event(), threading.Event()
    calls = []

    def owner():
        with tiny_model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: calls.append(threading.current_thread().name))]):
            held.set()
            assert done.wait(WAIT)

    a = run_thread(owner)
    try:
        assert held.wait(WAIT)
        with pytest.raises(RuntimeError, match=r"forward on thread 'MainThread'.*held by thread 'worker' "
                                               r"\(id \d+\) \(inside a hooks\(\) block\).*copy\.deepcopy\(model\)"):
            tiny_model(tiny_tokens)
        with pytest.raises(RuntimeError, match=r"add_hook on thread 'MainThread'.*held by thread 'worker'"):
            tiny_model.add_hook("hook_embed", lambda x, hook: None)
        with pytest.raises(RuntimeError, match=r"a hooks\(\) block on thread 'MainThread'"):
            with tiny_model.hooks([("hook_embed", lambda x, hook: None)]):
                pass
        with pytest.raises(RuntimeError, match=r"reset_hooks on thread 'MainThread'"):
            tiny_model.reset_hooks()
    finally:
        done.set()
        finish(a)
    assert "error" not in a and calls == [], "the refused forward ran the other thread's hook"
    # Once the owner is done, this thread uses the model as before, with none of its hooks.
    assert not tiny_model.has_hooks
    with torch.no_grad():
        assert torch.equal(tiny_model(tiny_tokens), clean)


def test_two_generations_on_one_model_do_not_interleave(tiny_model):
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    solo = tiny_model.generate(prompt, max_new_tokens=4, eos_token_id=None)
    at_step, go_on = threading.Event(), threading.Event()
    steps = []

    def pause_at_step_1(x, hook):
        steps.append(hook.ctx["step"])
        if hook.ctx["step"] == 1:
            at_step.set()
            assert go_on.wait(WAIT)

    def owner():
        with tiny_model.hooks([("blocks.1.hook_mlp_out", pause_at_step_1)]):
            return tiny_model.generate(prompt, max_new_tokens=4, eos_token_id=None)

    a = run_thread(owner)
    try:
        assert at_step.wait(WAIT)
        with pytest.raises(RuntimeError, match=r"generate on thread 'MainThread'.*held by thread 'worker'"):
            tiny_model.generate(prompt, max_new_tokens=2, eos_token_id=None)
        assert all(p.ctx.get("step") == 1 for p in tiny_model.hook_dict.values()), "the refusal touched ctx"
    finally:
        go_on.set()
        finish(a)
    assert "error" not in a, a.get("error")
    assert steps == [0, 1, 2, 3]
    assert torch.equal(a["result"], solo)
    assert all("step" not in p.ctx for p in tiny_model.hook_dict.values()) and not tiny_model.has_hooks


def test_attaching_hooks_while_another_thread_is_mid_forward_is_refused(tiny_model, tiny_tokens):
    inside, leave = threading.Event(), threading.Event()

    def wait_inside(x, hook):
        if threading.current_thread().name == "worker":
            inside.set()
            assert leave.wait(WAIT)

    handles = tiny_model.add_hook("blocks.1.hook_resid_pre", wait_inside)
    try:
        with torch.no_grad():
            b = run_thread(lambda: tiny_model(tiny_tokens))
            try:
                assert inside.wait(WAIT)
                with pytest.raises(RuntimeError, match=r"a hooks\(\) block on thread 'MainThread' .* while thread "
                                                       r"'worker' .* is inside a forward"):
                    with tiny_model.hooks([("blocks.1.hook_mlp_out", lambda x, hook: x * 0)]):
                        pass
                with pytest.raises(RuntimeError, match=r"add_hook on thread 'MainThread' .* while thread 'worker'"):
                    tiny_model.add_hook("hook_embed", lambda x, hook: None)
            finally:
                leave.set()
                finish(b)
            assert "error" not in b
            assert torch.equal(b["result"], tiny_model(tiny_tokens)), "the worker's forward saw a foreign hook"
    finally:
        for handle in handles:
            handle.remove()
    assert not tiny_model.has_hooks


def test_one_copy_per_thread_runs_concurrently_and_exactly(tiny_model, tiny_tokens):
    """The advice in the error works: deep copies (even one made inside a hooks() block) are unowned."""
    scale = {"a": 2.0, "b": 3.0}
    expected = {}
    for name, s in scale.items():
        with torch.no_grad():
            expected[name] = tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook, s=s: x * s)])
    with tiny_model.hooks([("hook_embed", lambda x, hook: None)]):
        copies = {name: copy.deepcopy(tiny_model) for name in scale}
    for c in copies.values():
        c.reset_hooks()
    barrier = threading.Barrier(2, timeout=WAIT)

    def run(name):
        def hook(x, hook):
            barrier.wait()  # both threads are inside a hooked forward at once
            return x * scale[name]

        with torch.no_grad():
            return copies[name].run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_attn_out", hook)])

    outs = {name: run_thread(lambda name=name: run(name)) for name in scale}
    for name, out in outs.items():
        finish(out)
        assert "error" not in out, out.get("error")
        assert torch.equal(out["result"], expected[name])


# -- 5. nested hooks() of one function object ---------------------------------------------------
def test_nested_contexts_of_one_function_restore_the_exact_hook_list(tiny_model, tiny_tokens):
    name = "blocks.0.hook_resid_pre"
    point = tiny_model.hook_dict[name]
    seen = {}

    def record_in(x, hook):
        seen["in"] = x.clone()

    def add_one(x, hook):
        return x + 1

    def times_three(x, hook):
        return x * 3

    def record_out(x, hook):
        seen["out"] = x.clone()

    outer = [(name, record_in), (name, add_one), (name, times_three), (name, record_out)]
    with torch.no_grad(), tiny_model.hooks(outer):
        before = list(point.fwd_hooks)
        outer_logits = tiny_model(tiny_tokens)
        with tiny_model.hooks([(name, add_one)]):
            assert [r.fn for r in point.fwd_hooks] == [record_in, add_one, times_three, record_out, add_one]
            tiny_model(tiny_tokens)
        assert point.fwd_hooks == before, "the inner block removed the outer block's registration"
        seen.clear()
        logits = tiny_model(tiny_tokens)
        assert torch.equal(seen["out"], (seen["in"] + 1) * 3), "the outer hooks run in another order"
        assert torch.equal(logits, outer_logits)
    assert not tiny_model.has_hooks


def test_each_handle_removes_its_own_registration(tiny_model):
    point = tiny_model.hook_dict["hook_embed"]

    def f(x, hook):
        return None

    def g(x, hook):
        return None

    first = point.add_hook(f)
    point.add_hook(g)
    second = point.add_hook(f)
    try:
        second.remove()
        assert [r.fn for r in point.fwd_hooks] == [f, g]
        assert point.fwd_hooks[0] is first.registration
        second.remove()  # twice is harmless and removes nothing else
        assert [r.fn for r in point.fwd_hooks] == [f, g]
    finally:
        point.remove_hooks()


# -- 9. a hook result on another device ---------------------------------------------------------
def test_a_hook_returning_a_tensor_on_another_device_is_named(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"forward hook at blocks\.0\.hook_mlp_out returned a tensor on device "
                                         r"meta, expected device cpu"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_mlp_out",
                                                           lambda x, hook: torch.empty_like(x, device="meta"))])
    assert not tiny_model.has_hooks
