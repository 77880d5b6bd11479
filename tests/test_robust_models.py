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
