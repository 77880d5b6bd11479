"""TransformerLens's hook API on glassbox's classes: permanent hooks, context levels, reset_hooks'
signature, clear_contexts, HookPoint.layer(), list_hooks, mod_dict; glassbox's guarantees kept."""

import threading
import warnings

import pytest
import torch

from glassbox.hooks import HookPoint
from glassbox.hooks.hook_point import NoLayerError


@pytest.fixture
def model(tiny_model):
    # The model is shared by the session: whatever a test attaches, permanent hooks included, goes.
    yield tiny_model
    tiny_model.reset_hooks(including_permanent=True)
    assert not tiny_model.has_hooks


def run(model, tokens):
    with torch.no_grad():
        return model(tokens)


def counter(calls: list, label: str):
    return lambda x, hook: calls.append(label)


def test_permanent_hook_survives_resets_and_blocks_until_including_permanent(model, tiny_tokens):
    calls = []
    model.add_perma_hook("hook_embed", counter(calls, "perm"))
    model.add_hook("hook_embed", counter(calls, "plain"), is_permanent=True)
    model.add_hook("hook_embed", counter(calls, "temp"))
    model.reset_hooks()
    run(model, tiny_tokens)
    assert calls == ["perm", "plain"]
    calls.clear()
    with model.hooks(fwd_hooks=[("hook_embed", counter(calls, "block"))]):
        run(model, tiny_tokens)
    model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", counter(calls, "rwh"))])
    model.remove_all_hook_fns()
    run(model, tiny_tokens)
    assert calls == ["perm", "plain", "block", "perm", "plain", "rwh", "perm", "plain"]
    assert [r.is_permanent for r in model.hook_dict["hook_embed"].fwd_hooks] == [True, True]
    model.reset_hooks(including_permanent=True)
    calls.clear()
    run(model, tiny_tokens)
    assert calls == [] and not model.has_hooks


def test_a_permanent_hook_changes_the_forward_like_a_temporary_one(model, tiny_tokens):
    def zero_head_1(z, hook):
        return z * (torch.arange(z.shape[2]) != 1)[:, None]

    clean = run(model, tiny_tokens)
    ablated = model.run_with_hooks(tiny_tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head_1)])
    model.add_perma_hook("blocks.1.attn.hook_z", zero_head_1)
    model.reset_hooks()
    assert torch.equal(run(model, tiny_tokens), ablated)
    assert (ablated - clean).abs().max() > 1e-3
    model.reset_hooks(including_permanent=True)
    assert torch.equal(run(model, tiny_tokens), clean)


def test_context_levels_number_the_open_blocks(model, tiny_tokens):
    f = lambda x, hook: None
    point = model.hook_dict["hook_embed"]
    assert model.context_level == 0
    with model.hooks(fwd_hooks=[("hook_embed", f)]):
        assert model.context_level == 1
        with model.hooks(fwd_hooks=[("hook_embed", f)]):
            assert model.context_level == 2
            assert [r.context_level for r in point.fwd_hooks] == [1, 2]
            model.reset_hooks(level=1)  # only the outer block's hook
            assert [r.context_level for r in point.fwd_hooks] == [2]
        assert point.fwd_hooks == []
    assert model.context_level == 0


def test_a_hook_added_at_a_blocks_level_leaves_with_the_block(model, tiny_tokens):
    calls = []
    with model.hooks():
        model.add_hook("hook_embed", counter(calls, "scoped"), level=model.context_level)
        model.add_hook("hook_embed", counter(calls, "unscoped"))
        model.add_hook("hook_embed", counter(calls, "permanent"), level=1, is_permanent=True)
        run(model, tiny_tokens)
    run(model, tiny_tokens)
    assert calls == ["scoped", "unscoped", "permanent", "unscoped", "permanent"]
    model.reset_hooks(level=5)  # no hook of level 5: nothing removed
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 2


def test_reset_hooks_signature_direction_and_alias(model, tiny_tokens):
    f = lambda x, hook: None
    name = "blocks.0.hook_resid_mid"
    for direction, kept in (("fwd", (0, 1)), ("bwd", (1, 0)), ("both", (0, 0))):
        model.add_hook(name, f)
        model.add_hook(name, f, dir="bwd")
        model.reset_hooks(True, direction)
        point = model.hook_dict[name]
        assert (len(point.fwd_hooks), len(point.bwd_hooks)) == kept, direction
        model.reset_hooks()
    model.add_hook(name, f, dir="bwd")
    model.reset_hooks(dir="bwd")  # glassbox's earlier keyword
    assert not model.has_hooks
    model.add_hook(name, f)
    with pytest.raises(TypeError, match="clear_contexts.*direction='fwd'"):
        model.reset_hooks("fwd")
    with pytest.raises(ValueError, match="'sideways'"):
        model.reset_hooks(direction="sideways")
    with pytest.raises(ValueError, match="give one"):
        model.reset_hooks(direction="fwd", dir="bwd")
    assert len(model.hook_dict[name].fwd_hooks) == 1  # refused calls removed nothing


def test_contexts_cleared_by_reset_and_on_request(model):
    points = list(model.hook_dict.values())
    points[0].ctx["a"] = 1
    model.reset_hooks(clear_contexts=False)
    assert points[0].ctx == {"a": 1}
    model.reset_hooks()
    assert all(p.ctx == {} for p in points)
    with model.hooks():
        points[1].ctx["b"] = 2
    assert points[1].ctx == {"b": 2}  # clear_contexts=False by default, as in TransformerLens
    with model.hooks(clear_contexts=True):
        pass
    assert points[1].ctx == {}
    points[2].ctx["c"] = 3
    model.clear_contexts()
    assert points[2].ctx == {}


def test_kept_hooks_stay_only_after_a_body_that_succeeds(model, tiny_tokens):
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", counter(calls, "kept"))], reset_hooks_end=False):
        pass
    run(model, tiny_tokens)
    assert calls == ["kept"]
    model.reset_hooks()
    with pytest.raises(RuntimeError, match="body"):
        with model.hooks(fwd_hooks=[("hook_embed", counter(calls, "lost"))], reset_hooks_end=False):
            raise RuntimeError("body fails")
    assert not model.has_hooks
    model.run_with_hooks(tiny_tokens, fwd_hooks=[("hook_embed", counter(calls, "rwh"))], reset_hooks_end=False)
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    with pytest.raises(TypeError, match="reset_hooks_end"):
        with model.hooks(reset_hooks_end="no"):
            pass


def test_backward_hooks_fire_for_their_forward_after_removal(model, tiny_tokens):
    """A backward hook belongs to the forward it was attached for (torch's module hooks, hence
    TransformerLens): it fires in a backward made after run_with_hooks (or a hooks() block) removed it,
    in every backward through a retained graph, and one attached after the forward does not fire.
    The gradient it sees is autograd's own (a tensor hook on the same activation), bit for bit."""
    name = "blocks.0.hook_resid_mid"
    seen, late, own = [], [], {}

    def keep(x, hook):
        x.register_hook(lambda g: own.__setitem__("g", g.clone()))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the hooks can fire
        logits = model.run_with_hooks(tiny_tokens, fwd_hooks=[(name, keep)],
                                      bwd_hooks=[(name, lambda g, hook: seen.append(g.clone()))])
    assert not model.has_hooks
    model.add_hook(name, lambda g, hook: late.append(g), dir="bwd")
    logits[0, -1].sum().backward(retain_graph=True)
    logits[0, -1].sum().backward()
    model.reset_hooks()
    model.zero_grad(set_to_none=True)
    assert len(seen) == 2 and late == []
    torch.testing.assert_close(seen[0], own["g"], rtol=0, atol=0)
    torch.testing.assert_close(seen[1], own["g"], rtol=0, atol=0)
    assert own["g"].abs().max() > 0

    # A replacement returned after the block exited still applies: every path from the embedding to
    # the logits passes blocks.0.hook_resid_mid, so a zeroed gradient there leaves the embedding's zero.
    embed = {}

    def watch(x, hook):
        x.register_hook(lambda g: embed.__setitem__("g", g))

    with model.hooks(fwd_hooks=[("hook_embed", watch)],
                     bwd_hooks=[(name, lambda g, hook: torch.zeros_like(g))]):
        out = model(tiny_tokens)
    out[0, -1].sum().backward()
    model.zero_grad(set_to_none=True)  # the model is shared by the session
    assert embed["g"].shape == (*tiny_tokens.shape, model.cfg.d_model) and torch.count_nonzero(embed["g"]) == 0


def test_hook_point_layer():
    point = HookPoint()
    with pytest.raises(ValueError, match="no name"):
        point.layer()
    for name, layer in (("blocks.0.hook_resid_pre", 0), ("blocks.11.attn.hook_pattern", 11), ("blocks.7", 7)):
        point.name = name
        assert point.layer() == layer
    for name in ("hook_embed", "ln_final.hook_scale", "blocks.x1.hook_z"):
        point.name = name
        with pytest.raises(NoLayerError, match=f"{name}.*no layer index"):
            point.layer()
    assert issubclass(NoLayerError, ValueError) and issubclass(NoLayerError, IndexError)


def test_hook_point_remove_hooks_by_kind():
    point = HookPoint()
    f = lambda x, hook: None
    point.add_hook(f)
    point.add_perma_hook(f)
    point.add_hook(f, dir="bwd", level=2)
    point.add_hook(f, dir="bwd", level=3)
    point.remove_hooks()  # TransformerLens's default: forward, non-permanent
    assert [r.is_permanent for r in point.fwd_hooks] == [True] and len(point.bwd_hooks) == 2
    point.remove_hooks("bwd", level=2)
    assert [r.context_level for r in point.bwd_hooks] == [3]
    point.remove_hooks("both", including_permanent=True)
    assert not point.has_hooks
    with pytest.raises(TypeError, match="level"):
        point.add_hook(f, level="1")
    with pytest.raises(ValueError, match="direction"):
        point.remove_hooks("up")


def test_list_hooks_mod_dict_and_hook_points(model):
    f = lambda x, hook: None
    model.add_hook("hook_embed", f)
    model.add_perma_hook("blocks.1.hook_resid_pre", f, dir="bwd")
    listed = model.list_hooks()
    assert list(listed) == ["hook_embed", "blocks.1.hook_resid_pre"]
    assert [r.fn for r in listed["hook_embed"]] == [f]
    assert list(model.list_hooks(including_permanent=False)) == ["hook_embed"]
    assert list(model.list_hooks(dir="bwd")) == ["blocks.1.hook_resid_pre"]
    assert list(model.list_hooks(["hook_embed", "blocks.0.hook_resid_pre"])) == ["hook_embed"]
    assert model.list_hooks(lambda n: n.startswith("blocks")) == {"blocks.1.hook_resid_pre": listed["blocks.1.hook_resid_pre"]}
    assert model.mod_dict["blocks.0.attn"] is model.blocks[0].attn
    assert set(model.hook_dict) <= set(model.mod_dict) and "" not in model.mod_dict
    assert list(model.hook_points()) == list(model.hook_dict.values())


def test_permanent_hooks_obey_the_thread_guard(model, tiny_tokens):
    errors = []
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        for action in (lambda: model.add_perma_hook("hook_embed", lambda x, hook: None),
                       lambda: model.reset_hooks(including_permanent=True), model.clear_contexts):
            try:
                action()
            except RuntimeError as err:
                errors.append(str(err))
        done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
        inside.set()
        done.wait(10)
    thread.join()
    assert len(errors) == 3 and all("held by" in e for e in errors)
    assert not model.has_hooks


def test_setup_again_keeps_the_guard_and_open_blocks(model, tiny_tokens):
    # SAELens swaps a hook point for its wrapper module and calls setup() again.
    guard = model.hook_guard
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", counter(calls, "block"))]):
        model.setup()
        assert model.hook_guard is guard and model.context_level == 1
        run(model, tiny_tokens)
    assert calls == ["block"] and not model.has_hooks and model.context_level == 0
