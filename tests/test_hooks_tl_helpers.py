"""HookedRootModule's TransformerLens surface for a user's own module: ``run_with_cache`` on a
subclass, a settable ``context_level``, TransformerLens's private ``_enable_hook*`` helpers, and
``Registration.hook`` (TransformerLens's ``LensHandle.hook``). Oracles: hand computations on a toy
(TransformerLens's Main Demo model: x -> x**2 + 3 -> y**2 - 4), and the levels the hooks must carry."""

from unittest import mock

import pytest
import torch
from torch import nn

from glassbox.hooks import HookedRootModule, HookPoint


class SquareThenAdd(nn.Module):
    def __init__(self, offset: float):
        super().__init__()
        self.offset = nn.Parameter(torch.tensor(offset))

    def forward(self, x):
        return x ** 2 + self.offset


class TwoLayerModel(HookedRootModule):
    def __init__(self):
        super().__init__()
        self.layer1, self.layer2 = SquareThenAdd(3.0), SquareThenAdd(-4.0)
        self.hook_in, self.hook_mid, self.hook_out = HookPoint(), HookPoint(), HookPoint()
        self.setup()

    def forward(self, x):
        return self.hook_out(self.layer2(self.hook_mid(self.layer1(self.hook_in(x)))))


X = torch.tensor([5.0, -2.0])  # mid = 28, 7; out = 780, 45


def test_run_with_cache_on_a_user_s_subclass():
    model = TwoLayerModel()
    out, cache = model.run_with_cache(X)
    assert type(cache) is dict and list(cache) == ["hook_in", "hook_mid", "hook_out"]
    assert cache["hook_mid"].tolist() == [28.0, 7.0] and cache["hook_out"].tolist() == [780.0, 45.0]
    assert out.tolist() == [780.0, 45.0]
    assert list(model.run_with_cache(X, names_filter="hook_mid")[1]) == ["hook_mid"]
    assert list(model.run_with_cache(X, names_filter=["hook_out", "hook_in"])[1]) == ["hook_in", "hook_out"]  # forward order
    assert list(model.run_with_cache(X, names_filter=lambda n: n.endswith("t"))[1]) == ["hook_out"]
    assert model.run_with_cache(X[:1], remove_batch_dim=True)[1]["hook_mid"].shape == ()
    assert not model.has_hooks
    zeroed = model.run_with_hooks(X, fwd_hooks=[("hook_mid", lambda v, hook: v * 0)])
    assert zeroed.tolist() == [-4.0, -4.0] and not model.has_hooks


def test_run_with_cache_gradients_by_hand_and_parameters_left_alone():
    model = TwoLayerModel()
    out, cache = model.run_with_cache(torch.tensor(5.0), incl_bwd=True)
    # out = mid**2 - 4: d out / d out = 1, d out / d mid = 2 * mid = 56; the input needs no grad, so no hook_in_grad
    assert cache["hook_out_grad"].item() == 1.0 and cache["hook_mid_grad"].item() == 56.0
    assert "hook_in_grad" not in cache
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(names_filter="hook_mdi"), KeyError, "hook_mid"),
    (dict(names_filter=["hook_in", "nope"]), KeyError, "unknown hook name 'nope'"),
    (dict(incl_bwd=True), ValueError, r"one-element tensor; got \(2,\)"),
    (dict(pos_slice=-1), ValueError, "pos_slice needs activations with a known position axis"),
    (dict(reset_hooks_end=False), ValueError, "reset_hooks_end=False"),
])
def test_run_with_cache_refusals_leave_no_hook(kwargs, error, match):
    model = TwoLayerModel()
    with pytest.raises(error, match=match):
        model.run_with_cache(X, **kwargs)
    assert not model.has_hooks


def test_a_raising_forward_leaves_no_caching_hook():
    model = TwoLayerModel()
    with pytest.raises(TypeError):
        model.run_with_cache("not a tensor")
    assert not model.has_hooks and model.context_level == 0


def test_context_level_can_be_set_outside_blocks():
    model = TwoLayerModel()
    model.context_level = 5
    assert model.context_level == 5
    with model.hooks(fwd_hooks=[("hook_in", lambda v, hook: None)]):
        assert model.context_level == 6
        assert model.hook_in.fwd_hooks[0].context_level == 6
        model.add_hook("hook_mid", lambda v, hook: None, level=6)  # joins the open block: removed at its exit
        with pytest.raises(ValueError, match="cannot be set while 1 hooks"):
            model.context_level = 0
    assert model.context_level == 5 and not model.has_hooks
    for bad in (-1, 1.0, True, "2"):
        with pytest.raises(ValueError, match="context_level must be an int >= 0"):
            model.context_level = bad
    bare = HookedRootModule()  # TransformerLens's tests set it before setup()
    bare.context_level = 3
    assert bare.context_level == 3


def test_enable_hook_helpers_add_at_the_context_level():
    model = TwoLayerModel()
    model.context_level = 4
    fn = lambda v, hook: None
    model._enable_hook_with_name("hook_mid", hook=fn, dir="fwd")
    assert [(r.fn, r.context_level) for r in model.hook_mid.fwd_hooks] == [(fn, 4)]
    model._enable_hook(lambda name: name != "hook_mid", hook=fn, dir="bwd")
    assert [len(p.bwd_hooks) for p in model.hook_dict.values()] == [1, 0, 1]
    model._enable_hooks_for_points(model.hook_dict.items(), enabled=lambda n: n == "hook_out", hook=fn, dir="fwd")
    assert model.hook_out.fwd_hooks[0].context_level == 4
    with pytest.raises(KeyError, match="closest valid names: hook_mid"):
        model._enable_hook("hook_mdi", hook=fn, dir="fwd")
    with pytest.raises(TypeError, match="name"):  # the type checker in tests, else the method: both name it
        model._enable_hook(3, hook=fn, dir="fwd")
    model.reset_hooks(level=4)
    assert not model.has_hooks


def test_registration_hook_is_its_handle_with_ordered_ids():
    point = HookPoint()
    first = point.add_hook(lambda v, hook: None)
    second = point.add_hook(lambda v, hook: None, prepend=True)
    assert [r.hook for r in point.fwd_hooks] == [second, first] and second.id > first.id
    with mock.patch("torch.utils.hooks.RemovableHandle") as counter:  # TransformerLens's test counts this way
        counter.next_id = 1
        a, b = point.add_hook(lambda v, hook: None), point.add_hook(lambda v, hook: None, prepend=True)
        assert (a.id, b.id) == (1, 2)
    point.fwd_hooks[0].hook.remove()
    assert [r.hook for r in point.fwd_hooks] == [second, first, a]
