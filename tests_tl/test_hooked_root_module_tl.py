"""A user's own HookedRootModule subclass (TransformerLens's Main Demo toy) on glassbox.tl and on
TransformerLens 3.9: the same cache from ``run_with_cache`` (a plain dict in both), the same
``run_with_hooks`` output, and TransformerLens's private ``_enable_hook*`` helpers at a set
``context_level`` stamping the same levels."""

import torch
from torch import nn

import glassbox.tl.hook_points as ours
import transformer_lens.hook_points as theirs


def toy(lib):
    class SquareThenAdd(nn.Module):
        def __init__(self, offset):
            super().__init__()
            self.offset = nn.Parameter(torch.tensor(offset))

        def forward(self, x):
            return x ** 2 + self.offset

    class TwoLayerModel(lib.HookedRootModule):
        def __init__(self):
            super().__init__()
            self.layer1, self.layer2 = SquareThenAdd(3.0), SquareThenAdd(-4.0)
            self.hook_in, self.hook_mid, self.hook_out = lib.HookPoint(), lib.HookPoint(), lib.HookPoint()
            self.setup()

        def forward(self, x):
            return self.hook_out(self.layer2(self.hook_mid(self.layer1(self.hook_in(x)))))

    return TwoLayerModel()


X = torch.tensor([5.0, -2.0, 0.5])


def test_run_with_cache_and_hooks_equal_transformer_lens_s():
    a, b = toy(ours), toy(theirs)
    for kwargs in ({}, {"names_filter": "hook_mid"}, {"names_filter": ["hook_in", "hook_out"]},
                   {"names_filter": lambda n: n != "hook_in"}):
        (out_a, cache_a), (out_b, cache_b) = a.run_with_cache(X, **kwargs), b.run_with_cache(X, **kwargs)
        assert torch.equal(out_a, out_b)
        assert type(cache_a) is type(cache_b) is dict and sorted(cache_a) == sorted(cache_b), kwargs
        assert all(torch.equal(cache_a[k], cache_b[k]) for k in cache_a)
    zero = lambda v, hook: v * 0
    assert torch.equal(a.run_with_hooks(X, fwd_hooks=[("hook_mid", zero)]),
                       b.run_with_hooks(X, fwd_hooks=[("hook_mid", zero)]))
    _, grads_a = a.run_with_cache(torch.tensor(1.5), incl_bwd=True)
    _, grads_b = b.run_with_cache(torch.tensor(1.5), incl_bwd=True)
    assert sorted(grads_a) == sorted(grads_b) and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)


def test_enable_hook_helpers_stamp_the_same_levels():
    levels = []
    for lib in (ours, theirs):
        model = toy(lib)
        model.context_level = 5
        fn = lambda v, hook: None
        model._enable_hook("hook_mid", hook=fn, dir="fwd")
        model._enable_hook(lambda n: n == "hook_out", hook=fn, dir="bwd")
        model._enable_hooks_for_points(model.hook_dict.items(), enabled=lambda n: n == "hook_in", hook=fn, dir="fwd")
        levels.append({name: ([h.context_level for h in p.fwd_hooks], [h.context_level for h in p.bwd_hooks])
                       for name, p in model.hook_dict.items()})
        ids = [h.hook.id for p in model.hook_dict.values() for h in p.fwd_hooks]  # hook_in's, then hook_mid's
        assert len(ids) == 2 and ids[0] > ids[1]  # hook_in's was added last
    assert levels[0] == levels[1] == {"hook_in": ([5], []), "hook_mid": ([5], []), "hook_out": ([], [5])}
