"""EAP-IG's step grids, each against its formula: "paper" (Hanna et al.: alpha = k/m, k = 1..m, the
default), "eap-ig-code" (the EAP-IG code's get_scores_eap_ig: alpha = k/m, k = 0..m-1) and "midpoint".
alpha runs from the corrupted input (0) to the clean one (1), weights 1/m.

Oracle: on a small float64 model, the score of every edge into the logits is rebuilt from a gradient
written out by hand (the final LayerNorm and unembedding's derivative of the logit difference, in closed
form, at the residual stream of a forward the test hooks itself), summed over the grid's alpha points as
a Riemann sum; the exact integral over alpha is a composite Gauss-Legendre rule of the same gradient. The
two one-sided grids share m - 1 points, so their difference is an identity: (EAP - the corrupted-end
gradient's scores) / m, for every edge.
"""

import numpy as np
import pytest
import torch

from conftest import perturbed
from glassbox.interp.attribution.eap import POINTS, eap, interpolation_points
from glassbox.interp.attribution.edges import receivers, senders
from glassbox.interp.patching import LogitDiff
from glassbox.models import Config

CFG = Config(d_model=18, n_layers=2, n_heads=3, d_head=5, d_mlp=11, d_vocab=29, n_ctx=9, init_range=0.25)
N, SEQ = 2, 6
ANSWER, WRONG = torch.tensor([3, 17]), torch.tensor([20, 8])
METRIC = LogitDiff(ANSWER, WRONG)


def alphas(grid, m):
    """The grid's alpha points, written from the formulas (not from glassbox)."""
    if grid == "paper":
        return [k / m for k in range(1, m + 1)]
    if grid == "eap-ig-code":
        return [k / m for k in range(0, m)]
    return [1 - (k - 0.5) / m for k in range(1, m + 1)]  # midpoint: t = (k - 1/2)/m, alpha = 1 - t


@pytest.fixture(scope="module")
def setup():
    model = perturbed(CFG, seed=7, scale=0.15)
    g = torch.Generator().manual_seed(11)
    clean, corrupted = (torch.randint(0, CFG.d_vocab, (N, SEQ), generator=g) for _ in range(2))
    with torch.no_grad():
        _, c_cache = model.run_with_cache(clean)
        _, x_cache = model.run_with_cache(corrupted)
    return model, clean, corrupted, c_cache, x_cache


def sender_outputs(model, cache):
    """name -> [batch pos d_model]: each sender's output (the input, head results from W_O, MLP outputs)."""
    out = {"input": cache["blocks.0.hook_resid_pre"]}
    W_O_of = [model.blocks[layer].attn.W_O.detach() for layer in range(CFG.n_layers)]
    for layer in range(CFG.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        W_O = W_O_of[layer]
        for head in range(CFG.n_heads):
            out[f"a{layer}.h{head}"] = z[:, :, head] @ W_O[head]
        out[f"m{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"]
    return out


def logits_gradient(model, resid):
    """d mean_prompts(logit_B - logit_C at the last position) / d resid [batch pos d_model], in closed
    form through the final LayerNorm: (1/sigma) (u - mean(u) - xhat (xhat . u) / d), u = w * (W_U_B - W_U_C)."""
    ln = model.ln_final
    x = resid[:, -1]
    d = x.shape[-1]
    centred = x - x.mean(-1, keepdim=True)
    sigma = (centred.pow(2).mean(-1, keepdim=True) + model.cfg.layer_norm_eps).sqrt()
    xhat = centred / sigma
    u = ln.w * (model.W_U[:, ANSWER] - model.W_U[:, WRONG]).T  # [batch d_model]
    grad_last = (u - u.mean(-1, keepdim=True) - xhat * (xhat * u).sum(-1, keepdim=True) / d) / sigma
    grad = torch.zeros_like(resid)
    grad[:, -1] = grad_last / N
    return grad


def final_resids(model, clean, hook_name, values):
    """[point batch pos d_model]: the last residual stream of the clean run with ``hook_name``'s activation
    set to each of ``values`` (one stacked copy of the batch per value, in one forward)."""
    stacked = torch.cat(values)

    def put(x, hook):
        return stacked.to(x.dtype)
    store = {}
    hooks = [(hook_name, put), (f"blocks.{CFG.n_layers - 1}.hook_resid_post",
                                lambda x, hook: store.__setitem__("r", x.detach()))]
    with torch.no_grad():
        model.run_with_hooks(clean.repeat(len(values), 1), fwd_hooks=hooks)
    return store["r"].reshape(len(values), *clean.shape, -1)


def hand_logits_column(setup, alpha_points, weights=None):
    """[sender] float64: sum over the points of weight * Delta_s . g(alpha), g the logits gradient with
    the embeddings at corrupted + alpha (clean - corrupted) (EAP-IG-inputs)."""
    model, clean, corrupted, c_cache, x_cache = setup
    e_clean, e_corr = c_cache["blocks.0.hook_resid_pre"], x_cache["blocks.0.hook_resid_pre"]
    weights = weights if weights is not None else [1 / len(alpha_points)] * len(alpha_points)
    resids = final_resids(model, clean, "blocks.0.hook_resid_pre", [e_corr + a * (e_clean - e_corr)
                                                                    for a in alpha_points])
    with torch.no_grad():  # the closed form reads parameters: no autograd graph wanted
        g = sum(w * logits_gradient(model, r) for r, w in zip(resids, weights))
    a_clean, a_corr = sender_outputs(model, c_cache), sender_outputs(model, x_cache)
    return torch.tensor([float(((a_corr[s] - a_clean[s]) * g).sum()) for s in senders(CFG)], dtype=torch.float64)


def exact_integral(setup, panels=8, order=16):
    """The integral over alpha in [0, 1] of the same gradient: composite Gauss-Legendre, 8 panels of 16
    points (measured: within 6e-16 of 16 panels; a single 24-point rule is off by 3.6e-7, the integrand
    varies fast in places)."""
    nodes, weights = np.polynomial.legendre.leggauss(order)
    points = [(p + (x + 1) / 2) / panels for p in range(panels) for x in nodes]
    return hand_logits_column(setup, points, [w / 2 / panels for _ in range(panels) for w in weights])


def logits_column(graph):
    return graph.scores[:, graph.receivers.index("logits")].double()


def test_the_grids_are_their_formulas():
    assert POINTS == ("paper", "eap-ig-code", "midpoint")
    for m in (1, 2, 5, 7):
        for grid in POINTS:
            # glassbox's t is measured from the clean run: t = 1 - alpha
            assert interpolation_points(m, grid) == pytest.approx(sorted(1 - a for a in alphas(grid, m)), abs=1e-15)
    assert interpolation_points(5) == interpolation_points(5, "paper")


def test_the_old_ambiguous_name_is_refused_with_the_new_names(setup):
    model, clean, corrupted, _, _ = setup
    with pytest.raises(ValueError, match="'endpoint'.*'paper'.*'eap-ig-code'"):
        eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=2, points="endpoint")
    with pytest.raises(ValueError, match="points must be one of"):
        eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=2, points="left")


@pytest.mark.parametrize("grid", POINTS)
def test_each_grid_is_its_riemann_sum_by_hand(setup, grid):
    model, clean, corrupted, _, _ = setup
    m = 5
    graph = eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=m, points=grid)
    assert graph.metadata["points"] == grid
    expected = hand_logits_column(setup, alphas(grid, m))
    got = logits_column(graph)
    largest = expected.abs().max().item()
    assert largest > 0.05, largest
    err = (got - expected).abs().max().item() / largest
    # measured 1.5e-8 paper, 2.8e-8 eap-ig-code, 3.7e-8 midpoint (relative to the largest score, 0.49 to 0.56:
    # the float32 rounding of the scores, at most 6e-8), bound 3e-7
    assert err < 3e-7, (grid, err)


@pytest.mark.parametrize("method", ["EAP-IG-inputs", "EAP-IG-activations"])
def test_the_one_sided_grids_differ_by_the_end_gradients_over_m(setup, method):
    """paper_m - code_m = (g(clean) - g(corrupted)) / m: the grids share alpha = 1/m .. (m-1)/m."""
    model, clean, corrupted, _, _ = setup
    one = {grid: eap(model, clean, corrupted, METRIC, method=method, steps=1, points=grid).scores.double()
           for grid in ("paper", "eap-ig-code")}
    plain = eap(model, clean, corrupted, METRIC).scores.double()
    # measured 0 (the same gradient at alpha = 1); bound 1e-7, float32 ulps of scores up to 0.81
    assert (one["paper"] - plain).abs().nan_to_num().max() < 1e-7
    for m in (3, 5):
        paper = eap(model, clean, corrupted, METRIC, method=method, steps=m, points="paper").scores.double()
        code = eap(model, clean, corrupted, METRIC, method=method, steps=m, points="eap-ig-code").scores.double()
        identity = (one["paper"] - one["eap-ig-code"]) / m
        assert identity.abs().nan_to_num().max() > 1e-2  # the ends' gradients differ: the grids do
        # measured 3.0e-8 (m = 3) and 6.6e-8 (m = 5) for both methods: the float32 rounding of four score
        # matrices up to 1.3 (at most 4 half-ulps, 2.4e-7); bound 3e-7
        assert (paper - code - identity).abs().nan_to_num().max() < 3e-7, m


def test_both_one_sided_grids_converge_to_the_integral_and_the_midpoint_faster(setup):
    exact = exact_integral(setup)
    model, clean, corrupted, _, _ = setup
    errors = {}
    for grid in POINTS:
        # the L1 error over the senders' edges into the logits (the largest single error is noisier)
        errors[grid] = [(logits_column(eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=m,
                                           points=grid)) - exact).abs().sum().item() for m in (8, 16, 32)]
    # measured (exact scores up to 0.52): paper 0.0817, 0.0411, 0.0205; eap-ig-code 0.0820, 0.0408, 0.0204
    # (each halving: a one-sided rule's 1/m); midpoint 1.96e-3, 4.70e-4, 1.18e-4 (quartering: 1/m^2). The
    # bands test the order of each rule (a float64 model: rounding ~1e-12 here), not a float bound.
    for grid in ("paper", "eap-ig-code"):
        e = errors[grid]
        assert 0.4 < e[1] / e[0] < 0.6 and 0.4 < e[2] / e[1] < 0.6, (grid, e)
    e = errors["midpoint"]
    assert 0.15 < e[1] / e[0] < 0.35 and 0.15 < e[2] / e[1] < 0.35, e
    assert e[2] < errors["paper"][2] / 20 and e[2] < errors["eap-ig-code"][2] / 20, errors
