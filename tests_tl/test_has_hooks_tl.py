"""``HookPoint.has_hooks`` called as TransformerLens 3.9's method, ``has_hooks(dir, including_permanent,
level)``, against TransformerLens 3.9's HookPoint given the same hooks; read as a flag (glassbox's use),
it stays true exactly while a hook is attached."""

import itertools

import pytest
import torch

from glassbox.hooks import HookPoint as OurPoint
from transformer_lens.hook_points import HookPoint as TheirPoint

ADDS = [  # (dir, is_permanent, level) of each hook added, in order
    [], [("fwd", False, None)], [("bwd", False, None)], [("fwd", True, None)], [("bwd", True, 2)],
    [("fwd", False, 0), ("fwd", False, 1), ("bwd", False, 2)],
    [("fwd", True, 0), ("bwd", False, 1), ("fwd", False, 0)], [("bwd", True, None), ("bwd", True, 3)],
]
QUERIES = list(itertools.product(["fwd", "bwd", "both"], [True, False], [None, 0, 1, 2, 3, -1]))


def hook(activation, hook):
    return activation


@pytest.mark.parametrize("adds", ADDS, ids=str)
def test_has_hooks_answers_as_transformer_lens(adds):
    ours, theirs = OurPoint(), TheirPoint()
    for dir, permanent, level in adds:
        ours.add_hook(hook, dir=dir, is_permanent=permanent, level=level)
        theirs.add_hook(hook, dir=dir, is_permanent=permanent, level=level)
    assert ours.has_hooks() is theirs.has_hooks() is bool(adds)
    for dir, permanent, level in QUERIES:
        got = ours.has_hooks(dir=dir, including_permanent=permanent, level=level)
        assert got is theirs.has_hooks(dir=dir, including_permanent=permanent, level=level), (dir, permanent, level)
    assert bool(ours.has_hooks) is bool(adds) and (ours.has_hooks == bool(adds))


def test_has_hooks_follows_removal_and_refuses_a_bad_direction():
    ours = OurPoint()
    ours.add_hook(hook, dir="bwd", level=1)
    assert ours.has_hooks(dir="bwd", level=1) and not ours.has_hooks(dir="fwd")
    ours.remove_hooks(dir="bwd")
    assert not ours.has_hooks and not ours.has_hooks()
    with pytest.raises(ValueError, match="'fwd' or 'bwd' or 'both', got 'invalid'"):
        ours.has_hooks(dir="invalid")
    with pytest.raises(TypeError, match="level must be an int"):
        ours.has_hooks(level="0")
    assert torch.equal(ours(torch.ones(2)), torch.ones(2))


FILTERS = [None, "hook_a", ["hook_a", "hook_c"], ["hook_c"], lambda name: name.endswith("b"), "nope", []]


@pytest.mark.parametrize("as_property", [False, True])
def test_list_hooks_mixin_lists_what_transformer_lens_s_mixin_lists(as_property):
    """The mixin on any class with a hook_dict (an attribute, or a property as TransformerLens's bridge
    has), against TransformerLens 3.9's mixin reading the same hook points."""
    from glassbox.tl.hook_points import HookIntrospectionMixin as Ours
    from transformer_lens.hook_points import HookIntrospectionMixin as Theirs

    points = {name: OurPoint() for name in ("hook_a", "hook_b", "hook_c")}
    points["hook_a"].add_hook(hook, dir="fwd", is_permanent=True)
    points["hook_a"].add_hook(hook, dir="bwd")
    points["hook_b"].add_hook(hook, dir="fwd", level=1)
    second = lambda activation, hook: activation  # noqa: E731
    points["hook_b"].add_hook(second, dir="fwd", is_permanent=True)

    def bag(base):
        if as_property:
            return type("Bag", (base,), {"hook_dict": property(lambda self: points)})()
        made = type("Bag", (base,), {})()
        made.hook_dict = points
        return made

    ours, theirs = bag(Ours), bag(Theirs)
    for name_filter, dir, permanent in itertools.product(FILTERS, ["fwd", "bwd", "both"], [True, False]):
        got = ours.list_hooks(name_filter=name_filter, dir=dir, including_permanent=permanent)
        want = theirs.list_hooks(name_filter=name_filter, dir=dir, including_permanent=permanent)
        assert {k: [r.user_hook for r in v] for k, v in got.items()} == \
               {k: [r.user_hook for r in v] for k, v in want.items()}, (name_filter, dir, permanent)
    assert ours.list_hooks(including_permanent=False) == {"hook_a": points["hook_a"].bwd_hooks,
                                                          "hook_b": points["hook_b"].fwd_hooks[:1]}


def test_hooked_root_module_has_the_mixin():
    from glassbox.tl.hook_points import HookedRootModule, HookIntrospectionMixin

    assert issubclass(HookedRootModule, HookIntrospectionMixin)
