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
