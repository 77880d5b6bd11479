"""Optimizer and schedule: which parameters decay, and the warm-up + cosine shape, by hand."""

import math

import pytest
import torch

from glassbox.models import Config
from glassbox.train import init_model, lr_at, make_optimizer, param_groups

CFG = Config(d_model=15, n_layers=2, n_heads=3, d_vocab=29, n_ctx=17, d_mlp=22)
MATRICES = {"embed.W_E", "pos_embed.W_pos"} | {
    f"blocks.{layer}.{name}" for layer in range(2)
    for name in ("attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O", "mlp.W_in", "mlp.W_out")}


def test_weight_decay_groups_hold_matrices_and_vectors():
    model = init_model(CFG, seed=0)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == MATRICES
    vectors = {names[id(p)] for p in no_decay["params"]}
    assert vectors and all(n.rsplit(".", 1)[-1] in ("w", "b") or ".b_" in n for n in vectors)
    assert {n for n in vectors if model.get_parameter(n).ndim == 2} == {
        f"blocks.{layer}.attn.b_{x}" for layer in range(2) for x in "QKV"}, "2-D biases are not matrices"
    assert len(MATRICES) + len(vectors) == len(names), "a parameter is in no group (or a tied one twice)"
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)


def test_zero_gradient_step_shrinks_only_matrices():
    # AdamW with a zero gradient moves nothing but applies the decoupled decay p *= 1 - lr * wd.
    model = init_model(CFG, seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model, lr=0.01, weight_decay=0.5)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        expected = before[name] * (1 - 0.01 * 0.5) if name in MATRICES else before[name]
        torch.testing.assert_close(p.detach(), expected, atol=0, rtol=1e-7, msg=name)


def test_schedule_shape_by_hand():
    lr, warm, total, floor = 0.3, 10, 110, 0.1
    got = [lr_at(s, lr, warm, total, floor) for s in range(total + 5)]
    # The schedule is float64 arithmetic on Python floats: equal up to rounding, so rel=1e-12.
    assert got[:warm] == pytest.approx([lr * (s + 1) / warm for s in range(warm)], rel=1e-12)
    assert got[warm] == pytest.approx(lr, rel=1e-12)
    # halfway through the decay the cosine is at the mean of peak and floor
    assert got[warm + 50] == pytest.approx((lr + lr * floor) / 2, rel=1e-12)
    assert got[warm + 25] == pytest.approx(lr * floor + lr * (1 - floor) * (1 + math.cos(math.pi / 4)) / 2,
                                           rel=1e-12)
    decay = got[warm:]
    assert all(a >= b for a, b in zip(decay, decay[1:])), "lr must not rise after the warm-up"
    assert got[total:] == pytest.approx([lr * floor] * 5, rel=1e-12)


@pytest.mark.parametrize("args,match", [((0, 1.0, 5, 3), "warmup_steps"), ((0, 1.0, 0, 0), "total"),
                                        ((0, 1.0, 1, 5, 1.5), "min_lr_frac")])
def test_schedule_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        lr_at(*args)


def test_optimizer_rejects_bad_hyperparameters():
    model = init_model(CFG, seed=0)
    with pytest.raises(ValueError, match="lr"):
        make_optimizer(model, lr=0.0, weight_decay=0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        make_optimizer(model, lr=1e-3, weight_decay=-1.0)
