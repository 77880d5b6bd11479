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


# -- 2. a mean over no targets ------------------------------------------------------------------
def test_a_loss_with_no_real_target_is_refused(tiny_model):
    tokens = torch.tensor([[3, 1, 4], [1, 5, 9]])
    for mask in ([[1, 0, 0], [0, 0, 1]], [[0, 1, 0], [1, 0, 0]]):
        with pytest.raises(ValueError, match=r"no target: attention_mask \(2, 3\) leaves no position"):
            tiny_model(tokens, attention_mask=torch.tensor(mask), return_type="loss")
    # One real pair: the mean is that pair's cross-entropy, computed by hand in float64.
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    with torch.no_grad():
        logits, loss = tiny_model(tokens, attention_mask=mask, return_type="both")
        per_token = tiny_model(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
    expected = -torch.log_softmax(logits[0, 0].double(), -1)[1]
    assert abs(float(loss) - float(expected)) < 1e-5  # measured 1.1e-7 (loss 3.4): 94x
    assert per_token.shape == (2, 2) and float(per_token.abs().sum() - per_token[0, 0]) == 0


# -- 3. flags of the wrong type -----------------------------------------------------------------
UNCHECKED = r"""
import json, torch
from glassbox.models import Config, HookedTransformer
torch.manual_seed(0)
m = HookedTransformer(Config(d_model=8, n_layers=1, n_heads=2, d_vocab=50257, n_ctx=11)).eval()
ids = torch.tensor([[3, 1, 4]])
calls = {
    "forward prepend_bos": lambda: m("hello there", prepend_bos="False"),
    "to_tokens prepend_bos": lambda: m.to_tokens("hello there", prepend_bos="False"),
    "to_str_tokens prepend_bos": lambda: m.to_str_tokens("hello", prepend_bos=0),
    "loss_per_token": lambda: m(ids, return_type="loss", loss_per_token="False"),
    "generate do_sample": lambda: m.generate(ids, max_new_tokens=1, do_sample="False"),
    "generate use_past_kv_cache": lambda: m.generate(ids, max_new_tokens=1, use_past_kv_cache="no"),
}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = None
    except Exception as err:
        out[name] = [type(err).__name__, str(err)]
print(json.dumps(out))
"""


def test_flags_of_another_type_are_refused_by_name_without_the_checker():
    """Outside this suite no type checker runs, so the library's own check is all a user has."""
    run = subprocess.run([sys.executable, "-c", UNCHECKED], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {
        "forward prepend_bos": ["TypeError", "prepend_bos must be True, False or None, got 'False' (str)"],
        "to_tokens prepend_bos": ["TypeError", "prepend_bos must be True, False or None, got 'False' (str)"],
        "to_str_tokens prepend_bos": ["TypeError", "prepend_bos must be True, False or None, got 0 (int)"],
        "loss_per_token": ["TypeError", "loss_per_token must be True or False, got 'False' (str)"],
        "generate do_sample": ["TypeError", "do_sample must be True or False, got 'False' (str)"],
        "generate use_past_kv_cache": ["TypeError", "use_past_kv_cache must be True or False, got 'no' (str)"],
    }


@pytest.mark.parametrize("call", ["forward", "generate", "run_with_cache"])
def test_padding_side_is_checked_with_token_ids_too(tiny_model, call):
    tokens = torch.tensor([[3, 1, 4]])
    fns = {"forward": tiny_model, "generate": lambda t, **kw: tiny_model.generate(t, 1, **kw),
           "run_with_cache": tiny_model.run_with_cache}
    with pytest.raises(ValueError, match=r"padding_side must be 'left' or 'right', got 'middle'"):
        fns[call](tokens, padding_side="middle")
    assert not tiny_model.has_hooks


# -- 4. start_at_layer with targets of another shape --------------------------------------------
def test_start_at_layer_refuses_tokens_and_masks_of_another_shape(tiny_model):
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        _, cache = tiny_model.run_with_cache(tokens, names_filter=["blocks.1.hook_resid_pre"])
        resid = cache["blocks.1.hook_resid_pre"]
        # The oracle for the accepted case: the whole forward's loss, bit for bit.
        assert torch.equal(tiny_model(resid, start_at_layer=1, tokens=tokens, return_type="loss"),
                           tiny_model(tokens, return_type="loss"))
        for other in (torch.tensor([[3, 1, 4, 1, 5, 9, 2]]), tokens[:, :3], tokens.expand(2, 5)):
            with pytest.raises(ValueError, match=rf"tokens have shape \({other.shape[0]}, {other.shape[1]}\), "
                                                 r"the residual stream \(1, 5\) \(batch pos\)"):
                tiny_model(resid, start_at_layer=1, tokens=other, return_type="loss")
        with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 7\), the residual stream has "
                                             r"batch pos \(1, 5\)"):
            tiny_model(resid, start_at_layer=1, attention_mask=torch.ones(1, 7, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"tokens= gives the loss's targets with start_at_layer only"):
            tiny_model(tokens, tokens=tokens, return_type="loss")


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


# -- 6. a fault mid-step leaves the user's KV cache as it was ----------------------------------
def cache_state(kv: KVCache) -> list:
    tensors = [t for layer in kv.layers for t in (layer.k, layer.v)] + [kv.key_mask]
    return [None if t is None else t.clone() for t in tensors]


def assert_same_state(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None) and (x is None or (x.shape == y.shape and torch.equal(x, y)))


@pytest.mark.parametrize("at", ["blocks.1.hook_resid_pre", "blocks.1.attn.hook_z", "ln_final.hook_normalized"])
@pytest.mark.parametrize("padded", [False, True])
def test_a_hook_raising_mid_step_leaves_the_cache_as_it_was(tiny_model, at, padded):
    prompt = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]) if padded else None
    step = torch.tensor([[7], [8]])

    def boom(x, hook):
        raise KeyboardInterrupt(hook.name)

    with torch.no_grad():
        kv, reference = KVCache(TINY["n_layer"]), KVCache(TINY["n_layer"])
        tiny_model(prompt, attention_mask=mask, past_kv_cache=kv)
        tiny_model(prompt, attention_mask=mask, past_kv_cache=reference)
        before = cache_state(kv)
        with pytest.raises(KeyboardInterrupt):
            with tiny_model.hooks([(at, boom)]):
                tiny_model(step, past_kv_cache=kv)
        assert len(kv) == 4
        assert_same_state(cache_state(kv), before)
        # And the cache works on: the next step equals one on a cache that never saw the fault.
        assert torch.equal(tiny_model(step, past_kv_cache=kv), tiny_model(step, past_kv_cache=reference))
        assert_same_state(cache_state(kv), cache_state(reference))


# -- 7 and 8. numpy arrays, unsigned ids, list masks --------------------------------------------
@pytest.fixture(scope="module")
def text_model():
    torch.manual_seed(0)
    return HookedTransformer(Config(d_model=14, n_layers=2, n_heads=2, d_vocab=50257, n_ctx=11)).eval()


def test_numpy_ids_read_like_the_tensor_of_the_same_shape(text_model):
    # GPT-2's ids 6 and 7 are the single characters "'" and "(".
    for ids in (np.array([[6]]), np.array([6]), np.array([[6, 7]], dtype=np.int32), np.array([6, 7], dtype=np.uint16)):
        expected = ["'"] if ids.size == 1 else ["'", "("]
        assert text_model.to_str_tokens(ids) == expected == text_model.to_str_tokens(torch.from_numpy(ids.astype(np.int64)))
    assert text_model.to_str_tokens(np.array([[6], [7]])) == ["'", "("]  # [pos 1] squeezes, as in TransformerLens
    with pytest.raises(ValueError, match=r"one sequence of ids.*\(2, 2\)"):
        text_model.to_str_tokens(np.array([[6, 7], [7, 6]]))
    assert text_model.to_string(np.array([[6, 7], [7, 6]])) == ["'(", "('"]
    assert text_model.to_string(np.array([6, 7])) == "'("


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_ids_convert_exactly_or_are_named(tiny_model, dtype):
    tokens = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    with torch.no_grad():
        expected = tiny_model(tokens)
        assert torch.equal(tiny_model(tokens.to(dtype)), expected)
        assert torch.equal(tiny_model(tokens.numpy().astype(str(dtype).split(".")[1])), expected)
        assert torch.equal(tiny_model.generate(tokens.to(dtype), 2, eos_token_id=None),
                           tiny_model.generate(tokens, 2, eos_token_id=None))
    with pytest.raises(ValueError, match=rf"token id {V} is outside \[0, d_vocab={V}\)"):
        tiny_model(torch.tensor([[1, V]]).to(dtype))


def test_uint64_ids_above_int64_are_named_not_wrapped(tiny_model):
    for value in (2**63, 2**63 + 5, 2**64 - 1):
        ids = torch.from_numpy(np.array([[1, value]], dtype=np.uint64))
        with pytest.raises(ValueError, match=rf"token id {value} \(dtype torch.uint64\) is outside the int64 range"):
            tiny_model(ids)
    with pytest.raises(ValueError, match=rf"token id {2**40} is outside \[0, d_vocab={V}\)"):
        tiny_model(torch.from_numpy(np.array([[1, 2**40]], dtype=np.uint64)))


def test_list_and_numpy_attention_masks_mean_the_tensor_mask(tiny_model):
    tokens = torch.tensor([[3, 1, 4], [1, 5, 9]])
    mask = [[0, 1, 1], [1, 1, 1]]
    with torch.no_grad():
        expected = tiny_model(tokens, attention_mask=torch.tensor(mask))
        for same in (mask, np.array(mask), np.array(mask, dtype=bool), [[False, True, True], [True, True, True]],
                     torch.tensor(mask, dtype=torch.uint16)):
            assert torch.equal(tiny_model(tokens, attention_mask=same), expected)
        gen = tiny_model.generate(tokens, 2, attention_mask=torch.tensor(mask), eos_token_id=None)
        assert torch.equal(tiny_model.generate(tokens, 2, attention_mask=mask, eos_token_id=None), gen)
    with pytest.raises(ValueError, match=r"attention_mask must be a rectangular array of numbers, got list"):
        tiny_model(tokens, attention_mask=[[1, 1, 1], [1, 1]])
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 2\), tokens have \(2, 3\)"):
        tiny_model(tokens, attention_mask=[1, 1])
    with pytest.raises(ValueError, match=r"attention_mask holds 2"):
        tiny_model(tokens, attention_mask=np.array([[1, 2, 1], [1, 1, 1]]))


# -- 9. a hook result on another device ---------------------------------------------------------
def test_a_hook_returning_a_tensor_on_another_device_is_named(tiny_model, tiny_tokens):
    with pytest.raises(ValueError, match=r"forward hook at blocks\.0\.hook_mlp_out returned a tensor on device "
                                         r"meta, expected device cpu"):
        tiny_model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.0.hook_mlp_out",
                                                           lambda x, hook: torch.empty_like(x, device="meta"))])
    assert not tiny_model.has_hooks


# -- 10. rotary tables sized by use -------------------------------------------------------------
def eager_tables(n_ctx: int, rotary_dim: int, base: float, dtype) -> tuple:
    """The tables as they were built before: float64 for every row up to n_ctx, then cast."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_config(n_ctx: int, **kw) -> Config:
    return preset_config("modern", d_model=24, n_layers=3, n_heads=3, d_vocab=V, n_ctx=n_ctx, **kw)


def test_a_huge_n_ctx_costs_nothing_until_positions_are_used():
    start = time.perf_counter()
    model = HookedTransformer(rotary_config(10**8)).eval()
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"construction took {elapsed:.2f} s"
    tables = {id(b.attn.rotary) for b in model.blocks}
    assert len(tables) == 1, "each layer built its own table"
    table = model.blocks[0].attn.rotary
    assert table.rows == 0
    # Nothing but the parameters is allocated: no buffer, no table of n_ctx rows.
    assert list(model.buffers()) == []
    small = HookedTransformer(rotary_config(40), init=False).eval()
    small.load_state_dict(model.state_dict())
    tokens = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(model(tokens), small(tokens))
    assert table.rows == type(table).MIN_ROWS == 64


def test_n_ctx_beyond_2_31_or_not_positive_is_refused_by_value():
    assert Config(d_model=4, n_layers=1, n_heads=1, d_vocab=5, n_ctx=2**31).n_ctx == 2**31
    for bad in (2**31 + 1, 10**12):
        with pytest.raises(ValueError, match=rf"Config.n_ctx={bad} is more than 2\*\*31 positions"):
            Config(d_model=4, n_layers=1, n_heads=1, d_vocab=5, n_ctx=bad)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"Config.n_ctx must be a positive int, got {bad}"):
            Config(d_model=4, n_layers=1, n_heads=1, d_vocab=5, n_ctx=bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim,base", [(8, 10000.0), (6, 500.0), (128, 500000.0)])
def test_grown_tables_equal_the_eager_tables_bit_for_bit(dtype, rotary_dim, base):
    from glassbox.models.positional import RotaryTable

    n_ctx = 3000
    expected = eager_tables(n_ctx, rotary_dim, base, dtype)
    table = RotaryTable(n_ctx, rotary_dim, base)
    for length in (1, 5, 64, 65, 200, 129, 1500, n_ctx):
        cos, sin = table.tables(length, torch.device("cpu"), dtype)
        assert cos.dtype == dtype and min(n_ctx, max(length, 64)) <= cos.shape[0] <= n_ctx
        rows = cos.shape[0]
        assert torch.equal(cos, expected[0][:rows]) and torch.equal(sin, expected[1][:rows]), (length, rows)
    assert table.rows == n_ctx


def test_a_model_cast_after_construction_reads_tables_of_its_new_dtype():
    torch.manual_seed(0)
    built32 = HookedTransformer(rotary_config(40)).eval()
    built64 = HookedTransformer(rotary_config(40), init=False, dtype=torch.float64).eval()
    built64.load_state_dict(built32.state_dict())
    tokens = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        built32(tokens)  # float32 tables made first, then the cast
        cast64 = built32.to(torch.float64)
        assert torch.equal(cast64(tokens), built64(tokens))
        cos, _ = cast64.blocks[0].attn.rotary.tables(13, torch.device("cpu"), torch.float64)
    assert torch.equal(cos, eager_tables(cos.shape[0], 8, 10000.0, torch.float64)[0])


def test_generation_across_a_table_growth_matches_full_recomputation():
    torch.manual_seed(0)
    model = HookedTransformer(rotary_config(10**6), dtype=torch.float64).eval()
    prompt = torch.randint(0, V, (2, 60), generator=torch.Generator().manual_seed(4))
    out, cached = model.generate(prompt, 10, eos_token_id=None, output_logits=True)
    assert model.blocks[0].attn.rotary.rows == 128  # grew from 64 to 128 rows mid-generation
    with torch.no_grad():
        full = model(out)[:, 59:69]
    assert float((cached - full).abs().max()) < 1e-12  # float64: measured 1.6e-15 (logits up to 2.9)
