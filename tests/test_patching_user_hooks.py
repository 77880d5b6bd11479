"""Sweeps under the user's own hooks equal a one-patch-per-forward loop run under the same hooks.

The oracle: ``with model.hooks(user): loop_value(...)`` (patching_oracle.py), one plain forward per
grid point, the user's hooks running before the patch; for path patching, the IOI procedure with
plain full forwards under the same hooks. User hooks read a position, a batch statistic over the
prompts, a per-prompt value from ``hook.ctx``, and the positions of the final norm's output; each is
attached to the model and, separately, passed as ``fwd_hooks=``, at memory budgets that give one
variant per pass, a few per pass, and all in one. Three prompts, so batch statistics matter.

Measured on this model (float32): the largest |batched - loop| over every grid point, hook set,
attachment and budget is 9.5e-7 (values from -1.1 to 3.8); ATOL = 3e-6. Before user hooks were
honoured the same sweeps were off by up to 1.9 (the readout hook), 1.9 (a position on a cut layout),
1.6 (a hook applied twice where variants join), 0.1 (the batch mean, depending on the budget), or
raised (a per-prompt ctx value against a stacked batch).
"""

import itertools

import pytest
import torch

from glassbox.interp.patching import (LogitDiff, patch_attn_out, patch_head_pattern, patch_head_pattern_by_pos,
                                      patch_head_z, patch_resid_pre, path_patch, path_patch_heads)
from patching_oracle import SIZES, loop_value, path_patch_by_forwards, tiny_model

ATOL = 3e-6  # measured worst 9.5e-7 (sweeps, path patching, every budget and attachment)
N_PROMPTS, SEQ = 3, 6
BUDGETS = (4_000, 100_000, 2**30)  # one variant per pass, three per pass, every variant in one pass
# Position bands per budget: one per position (the deepest cut), 3, and the default (1 band at SEQ=6).
BANDS = {4_000: SEQ, 100_000: 3, 2**30: None}
METRIC = LogitDiff(torch.tensor([3, 17, 5]), torch.tensor([29, 8, 11]))
CTX_POINT = "blocks.1.attn.hook_z"


def zero_position_2(act, hook):
    act = act.clone()
    act[:, 2:3] = 0  # a slice: on a cut layout it zeroes another position, or none, without an error
    return act


def minus_batch_mean(act, hook):
    return act - act.mean(0, keepdim=True)


def scale_per_prompt_from_ctx(act, hook):
    return act * hook.ctx["scale"].view(-1, *[1] * (act.ndim - 1))


def add_position_ramp(act, hook):  # not idempotent: applied twice, it adds twice
    # Along a direction that is not constant over d_model, which the LayerNorms would remove.
    direction = torch.linspace(-1, 2, act.shape[-1], dtype=act.dtype)
    return act + 0.3 * torch.arange(act.shape[1], dtype=act.dtype)[:, None] * direction


def add_ramp_in_place(act, hook):  # edits the tensor it is given and returns None
    act.add_(0.3 * torch.arange(act.shape[1], dtype=act.dtype)[:, None] * torch.linspace(-1, 2, act.shape[-1],
                                                                                          dtype=act.dtype))


def tilt_by_position(act, hook):
    return act * (1 + 0.2 * torch.arange(act.shape[1], dtype=act.dtype))[:, None]


HOOKS = {
    "position": [("blocks.0.hook_resid_post", zero_position_2)],
    "batch_mean": [("blocks.1.hook_mlp_out", minus_batch_mean)],
    "ctx": [(CTX_POINT, scale_per_prompt_from_ctx)],
    "readout": [("ln_final.hook_normalized", tilt_by_position)],
    "join": [("blocks.1.hook_resid_pre", add_position_ramp)],  # where variants of layer 1 join
    "in_place": [("blocks.2.hook_resid_pre", add_ramp_in_place)],  # the base run must keep its own copy
}
HOOKS["all"] = [h for hooks in HOOKS.values() for h in hooks]
SWEEPS = {"resid_pre": patch_resid_pre, "z": patch_head_z, "pattern": patch_head_pattern, "attn_out": patch_attn_out}


@pytest.fixture(scope="module")
def setup():
    model = tiny_model()
    g = torch.Generator().manual_seed(5)
    clean = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    corrupted = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
    model.hook_dict[CTX_POINT].ctx["scale"] = torch.tensor([0.5, -1.0, 2.0])
    yield model, corrupted, cache
    model.hook_dict[CTX_POINT].ctx.clear()


def hook_state(model) -> dict:
    """Every hook point's hook lists: the list objects and their entries, by identity."""
    return {name: (id(p.fwd_hooks), [id(e) for e in p.fwd_hooks], id(p.bwd_hooks), [id(e) for e in p.bwd_hooks])
            for name, p in model.hook_dict.items()}


def run_sweep(model, corrupted, cache, sweep, hooks, attach: str, budget: int):
    before = hook_state(model)
    options = dict(memory_budget=budget, bands=BANDS[budget])
    if attach == "fwd_hooks":
        result = sweep(model, corrupted, cache, METRIC, fwd_hooks=hooks, **options)
    else:
        with model.hooks(fwd_hooks=hooks):
            inside = hook_state(model)
            result = sweep(model, corrupted, cache, METRIC, **options)
            assert hook_state(model) == inside, "the sweep left the user's hook lists changed"
    assert hook_state(model) == before
    return result.values


def loop(model, corrupted, cache, kind: str, hooks, shape: tuple, axes: tuple) -> torch.Tensor:
    out = torch.empty(shape)
    with model.hooks(fwd_hooks=hooks):
        for point in itertools.product(*(range(s) for s in shape)):
            out[point] = loop_value(model, corrupted, cache, METRIC, kind, dict(zip(axes, point)))
    return out


def assert_close_to(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    err = (got - expected).abs().max().item()
    assert err <= ATOL, f"{what}: max |batched - loop| = {err:.2e} > {ATOL}"


def check_sweep(model, corrupted, cache, kind: str, hooks, runs) -> None:
    """The sweep ``kind`` under ``hooks``, attached and at budgets (and bands) as ``runs`` says,
    equals the loop."""
    plain = SWEEPS[kind](model, corrupted, cache, METRIC).values
    axes = ("layer", "pos" if kind in ("resid_pre", "attn_out") else "head")
    expected = loop(model, corrupted, cache, kind, hooks, tuple(plain.shape), axes)
    spread = (expected.max() - expected.min()).item()
    assert spread > 1000 * ATOL, f"{kind} under hooks is nearly constant ({spread})"
    moved = (expected - plain).abs().max().item()
    assert moved > 1000 * ATOL, f"the hooks do not change the {kind} sweep ({moved}); the test proves nothing"
    for attach, budget in runs:
        got = run_sweep(model, corrupted, cache, SWEEPS[kind], hooks, attach, budget)
        assert_close_to(got, expected, f"{kind} ({attach}, memory_budget={budget})")


@pytest.mark.parametrize("kind", list(SWEEPS))
def test_sweeps_under_every_kind_of_user_hook_equal_the_loop_under_them(setup, kind):
    check_sweep(*setup, kind, HOOKS["all"], itertools.product(("model", "fwd_hooks"), BUDGETS))


@pytest.mark.parametrize("case", [c for c in HOOKS if c != "all"])
def test_each_kind_of_user_hook_alone(setup, case):
    check_sweep(*setup, "resid_pre", HOOKS[case], [("model", BUDGETS[1]), ("fwd_hooks", BUDGETS[0])])


def test_pattern_by_query_position_under_user_hooks(setup):
    """The query row cut (bands) is what a position-reading hook would see misplaced."""
    model, corrupted, cache = setup
    got = {(a, b): run_sweep(model, corrupted, cache, patch_head_pattern_by_pos, HOOKS["all"], a, b)
           for a, b in [("model", BUDGETS[0]), ("fwd_hooks", BUDGETS[-1])]}
    expected = loop(model, corrupted, cache, "pattern", HOOKS["all"], (3, 5, SEQ), ("layer", "head", "query_pos"))
    assert (expected.max() - expected.min()).item() > 1000 * ATOL
    for (attach, budget), values in got.items():
        assert_close_to(values, expected, f"pattern by query_pos ({attach}, memory_budget={budget})")


@pytest.mark.parametrize("receivers", ["logits", [(2, 1, "q"), (2, 3, "v")]])
def test_path_patch_heads_under_user_hooks_equals_reference(setup, receivers):
    model, corrupted, cache = setup
    hooks = HOOKS["all"]
    limit = 3 if receivers == "logits" else 2
    expected = torch.full((3, 5), float("nan"))
    parsed = [] if receivers == "logits" else receivers
    for layer, head in itertools.product(range(limit), range(5)):
        expected[layer, head] = path_patch_by_forwards(model, corrupted, cache, METRIC, [(layer, head)], parsed, hooks)
    plain = path_patch_heads(model, corrupted, cache, METRIC, receivers).values
    assert (expected[:limit] - plain[:limit]).abs().max().item() > 1000 * ATOL, "the hooks change nothing"
    for attach, budget in [("model", BUDGETS[0]), ("fwd_hooks", BUDGETS[-1])]:
        before = hook_state(model)
        if attach == "fwd_hooks":
            got = path_patch_heads(model, corrupted, cache, METRIC, receivers, memory_budget=budget, fwd_hooks=hooks)
        else:
            with model.hooks(fwd_hooks=hooks):
                got = path_patch_heads(model, corrupted, cache, METRIC, receivers, memory_budget=budget)
        assert hook_state(model) == before
        assert torch.isnan(got.values[limit:]).all()
        assert_close_to(got.values[:limit], expected[:limit], f"path_patch_heads to {receivers} ({attach}, {budget})")


def test_path_patch_with_frozen_mlps_under_user_hooks_equals_reference(setup):
    model, corrupted, cache = setup
    senders, receivers = [(0, 1), (1, 4)], [(2, 0, "k"), (2, 2, "q")]
    expected = path_patch_by_forwards(model, corrupted, cache, METRIC, senders, receivers, HOOKS["all"],
                                      freeze_mlps=True)
    got = path_patch(model, corrupted, cache, METRIC, senders, receivers, freeze_mlps=True, fwd_hooks=HOOKS["all"])
    assert abs((got - path_patch(model, corrupted, cache, METRIC, senders, receivers, freeze_mlps=True)).item()) \
        > 1000 * ATOL
    assert_close_to(got, expected, "path_patch with frozen MLPs")


class Boom(Exception):
    pass


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("attach", ["model", "fwd_hooks"])
def test_a_user_hook_raising_mid_sweep_leaves_the_hook_lists_exactly_as_they_were(setup, exc, attach):
    model, corrupted, cache = setup
    calls = []

    def fifth_call(act, hook):
        calls.append(act.shape[0])  # the loop's batch, one variant at a time, though all share a pass
        if len(calls) == 5:
            raise exc("user hook")

    kept = model.add_hook("blocks.2.hook_resid_mid", tilt_by_position)  # attached outside any block
    try:
        before = hook_state(model)
        with pytest.raises(exc):
            if attach == "fwd_hooks":
                patch_resid_pre(model, corrupted, cache, METRIC, fwd_hooks=[("blocks.1.hook_resid_pre", fifth_call)])
            else:
                with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", fifth_call)]):
                    patch_resid_pre(model, corrupted, cache, METRIC)
        assert calls == [N_PROMPTS] * 5, "the fault was meant to come mid-sweep, on one variant's batch"
        assert hook_state(model) == before
    finally:
        for handle in kept:
            handle.remove()
    assert not model.has_hooks, "the handle of a hook kept across the sweep no longer removes it"


@pytest.mark.parametrize("bad, message", [
    (lambda act, hook: act[:1], r"returned shape \(1, 6, 21\) torch.float32 on cpu for a batch of shape \(3, 6, 21\)"),
    (lambda act, hook: act.double(), r"returned shape \(3, 6, 21\) torch.float64"),
    (lambda act, hook: 0.0, "returned float"),
])
def test_a_user_hook_returning_the_wrong_shape_is_named(setup, bad, message):
    model, corrupted, cache = setup
    with pytest.raises(ValueError, match=r"user hook .*<lambda> at blocks.1.hook_resid_mid " + message):
        patch_attn_out(model, corrupted, cache, METRIC, fwd_hooks=[("blocks.1.hook_resid_mid", bad)])
    assert not model.has_hooks
