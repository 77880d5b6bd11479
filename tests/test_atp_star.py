"""AtP*: the QK fix against exact activation patching where attention saturates, its closed form
against a per-key softmax recompute, and GradDrop against its definition computed by hand.

Oracles: ``activation_patch`` (exact patching); for the closed form, the softmax recomputed with
one column replaced, key by key; for GradDrop, one forward per dropped layer in which forward hooks
detach that block's residual writes (a stop-gradient; the code under test gates the backward
instead, over one shared forward), gradients read at the nodes, and Kramár et al.'s eq. 11
(1/(L-1) sum over layers of |estimate|, per prompt, then the mean) written out here.
"""

import pytest
import torch

from glassbox.interp.attribution.atp import attribution_patch
from glassbox.interp.attribution.atp_qk import key_column_change
from glassbox.interp.attribution.atp_star import attribution_patch_star
from glassbox.interp.patching import LogitDiff, TargetLoss, activation_patch
from glassbox.models import Config, HookedTransformer

SIZES = dict(d_model=21, n_layers=3, n_heads=5, d_head=6, d_mlp=17, d_vocab=31, n_ctx=13, init_range=0.25)
N_PROMPTS, SEQ = 3, 9


def build(seed: int = 0, qk_scale: float = 1.0, **overrides) -> HookedTransformer:
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**{**SIZES, **overrides})).eval()
    with torch.no_grad():
        for block in model.blocks:  # larger queries and keys: saturated softmaxes
            block.attn.W_Q.mul_(qk_scale)
            block.attn.W_K.mul_(qk_scale)
    return model


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(5)
    clean = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    corrupted = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    metric = LogitDiff(torch.tensor([3, 11, 29]), torch.tensor([7, 2, 19]))
    return clean, corrupted, metric


def exact(model, clean, corrupted, metric, activation, axes):
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
    return activation_patch(model, corrupted, cache, metric, activation, axes)


def corrupted_metric(model, corrupted, metric) -> float:
    with torch.no_grad():
        return metric(model(corrupted)).mean().item()


def test_key_column_closed_form_equals_the_recomputed_softmax():
    g = torch.Generator().manual_seed(0)
    batch, heads, n = 2, 3, 7
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    scores = (torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64) * 12).masked_fill(~mask, float("-inf"))
    new = (scores + torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64) * 15)
    grad = torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64)
    got = key_column_change(scores, new.masked_fill(~mask, float("-inf")), grad)
    old = scores.softmax(-1)
    want = torch.zeros_like(got)
    for s in range(n):
        patched = scores.clone()
        patched[..., s] = torch.where(mask[:, s], new[..., s], scores[..., s])
        want[..., s] = ((patched.softmax(-1) - old) * grad).sum(-1)
    assert old.max(-1).values.mean() > 0.85  # most rows saturated: measured 0.91
    assert want.abs().max() > 1.0  # measured 2.6
    assert (got - want).abs().max().item() < 1e-14  # float64: measured 5.6e-16 (values up to 2.6), bound 1e-14: 18x
    assert torch.equal(got[..., ~mask], torch.zeros_like(got[..., ~mask]))  # masked keys are no nodes


def saturated_single_layer(kind: str) -> HookedTransformer:
    """One attention-only layer whose patterns saturate: GPT-2 attention with 3x queries and keys,
    or rotary grouped-query attention (6 query heads, 2 kv heads) with per-head q/k RMS norms whose
    weights are scaled 4x."""
    if kind == "gpt2":
        return build(0, qk_scale=3.0, attn_only=True, n_layers=1)
    model = build(0, attn_only=True, n_layers=1, normalization="RMS", positional="rotary", n_heads=6, d_head=4,
                  n_key_value_heads=2, qk_norm="head")
    with torch.no_grad():
        model.blocks[0].attn.q_norm.w.mul_(4.0)
        model.blocks[0].attn.k_norm.w.mul_(4.0)
    return model


@pytest.mark.parametrize("kind", ["gpt2", "rotary_gqa_qk_norm"])
@pytest.mark.parametrize("activation, axes", [("k", ("layer", "head")), ("k", ("layer", "pos", "head")),
                                              ("q", ("layer", "pos", "head")), ("q", ("layer", "head")),
                                              ("k", ("layer", "pos"))])
def test_qk_fix_is_exact_where_only_the_softmax_is_nonlinear(prompts, kind, activation, axes):
    """One attention-only layer with saturated patterns, read out through a frozen final-norm divisor:
    from the pattern on everything is linear, so the QK-fixed estimate is exact, while plain AtP,
    linear through the saturated softmax, is off by more than the effects themselves."""
    clean, corrupted, metric = prompts
    model = saturated_single_layer(kind)
    if kind != "gpt2":
        axes = tuple("kv_head" if a == "head" and activation == "k" else a for a in axes)
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupted)
    assert cache["blocks.0.attn.hook_pattern"].max(-1).values.mean() > 0.85  # saturated: measured 0.92, 0.96
    with model.hooks(fwd_hooks=[("ln_final.hook_scale", lambda act, hook: torch.full_like(act, 1.7))]):
        truth = exact(model, clean, corrupted, metric, activation, axes)
        plain = attribution_patch(model, clean, corrupted, metric, activation, axes)
        star = attribution_patch_star(model, clean, corrupted, metric, activation, axes, grad_drop=False)
        routed = attribution_patch(model, clean, corrupted, metric, activation, axes, method="atp*", grad_drop=False)
        effect = (truth.values - corrupted_metric(model, corrupted, metric)).abs().max().item()
    assert star.axes == truth.axes and star.labels == truth.labels
    assert torch.equal(star.values, routed.values)
    assert effect > 0.2  # measured 0.32 to 0.70 (gpt2), 0.34 to 0.42 (rotary)
    # measured 1.6 to 2.6 (gpt2: 2.3x to 6.8x the effect), 0.56 to 1.44 (rotary: 1.3x to 4.2x)
    assert (plain.values - truth.values).abs().max().item() > effect
    assert (star.values - truth.values).abs().max().item() < 5e-6  # measured 4.8e-7, bound 5e-6: 10x


def test_qk_fix_beats_plain_atp_through_a_nonlinear_downstream(prompts):
    """Two full layers with saturated softmaxes: downstream nonlinearity stays, so AtP* is not exact,
    but its error against exact patching is several times smaller than AtP's, node type by node type."""
    clean, corrupted, metric = prompts
    model = build(0, qk_scale=6.0, n_layers=2)
    for activation, axes in (("k", ("layer", "head")), ("k", ("layer", "pos", "head")),
                             ("q", ("layer", "pos", "head"))):
        truth = exact(model, clean, corrupted, metric, activation, axes)
        plain = (attribution_patch(model, clean, corrupted, metric, activation, axes).values - truth.values).abs()
        star = (attribution_patch_star(model, clean, corrupted, metric, activation, axes, grad_drop=False).values
                - truth.values).abs()
        # measured (max AtP vs AtP*; mean AtP vs AtP*): k all positions 8.2 vs 1.7, 1.96 vs 0.48; k by
        # position 11.5 vs 1.4, 0.55 vs 0.17; q by position 5.2 vs 0.99, 0.18 vs 0.10 (seeded, deterministic)
        assert star.max() < plain.max() / 2, (activation, axes, plain.max(), star.max())
        assert star.mean() < plain.mean() / 1.2, (activation, axes, plain.mean(), star.mean())


def hand_grad_drop(model, clean, corrupted, metric, layer_nodes):
    """1/(L-1) sum_l |I_l| per prompt, mean over prompts, with I_l from a forward in which block l's
    residual writes are detached. ``layer_nodes(acts, clean_acts, grads) -> [batch ...]`` per pass."""
    n_layers = model.cfg.n_layers
    names = [f"blocks.{l}.attn.hook_{p}" for l in range(n_layers) for p in ("z", "q", "k", "pattern")]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
    total = 0
    for dropped in range(n_layers):
        acts = {}

        def keep(act, hook):
            acts[hook.name] = act
            return act

        cut = lambda act, hook: act.detach()
        hooks = [(n, keep) for n in names] + [(f"blocks.{dropped}.hook_attn_out", cut),
                                              (f"blocks.{dropped}.hook_mlp_out", cut)]
        with model.hooks(fwd_hooks=hooks):
            objective = metric(model(corrupted)).sum()
        grads = dict(zip(names, torch.autograd.grad(objective, [acts[n] for n in names], allow_unused=True)))
        grads = {n: torch.zeros_like(acts[n]) if g is None else g for n, g in grads.items()}
        estimate = layer_nodes({n: a.detach() for n, a in acts.items()}, clean_cache, grads)
        total = total + estimate.abs()
    return (total / (n_layers - 1)).mean(0)


def z_nodes(acts, clean, grads):
    """[batch layer head]: sum over positions and d_head of (clean - corrupted) * grad."""
    layers = sorted({int(n.split(".")[1]) for n in acts})
    return torch.stack([((clean[f"blocks.{l}.attn.hook_z"] - acts[f"blocks.{l}.attn.hook_z"])
                         * grads[f"blocks.{l}.attn.hook_z"]).sum((1, 3)) for l in layers], 1)


def key_nodes(acts, clean, grads):
    """[batch layer pos head]: for key s, the pattern with column s recomputed from the clean key
    (scores q . k / sqrt(d_head), GPT-2 attention), times the pattern's gradient."""
    layers = sorted({int(n.split(".")[1]) for n in acts})
    out = []
    for l in layers:
        q, k = acts[f"blocks.{l}.attn.hook_q"], acts[f"blocks.{l}.attn.hook_k"]
        k_clean = clean[f"blocks.{l}.attn.hook_k"]
        grad = grads[f"blocks.{l}.attn.hook_pattern"]
        n, d = q.shape[1], q.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / d ** 0.5
        new = torch.einsum("bqhd,bkhd->bhqk", q, k_clean) / d ** 0.5
        old = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        per = []
        for s in range(n):
            patched = scores.clone()
            patched[..., s] = new[..., s]
            change = (patched.masked_fill(~mask, float("-inf")).softmax(-1) - old) * grad
            per.append(change.sum((-1, -2)))  # [batch head]
        out.append(torch.stack(per, 1))  # [batch pos head]
    return torch.stack(out, 1)


def test_grad_drop_equals_its_definition_by_hand(prompts):
    clean, corrupted, _ = prompts
    model = build(4, qk_scale=2.0)
    loss = TargetLoss(torch.tensor([5, 17, 23]))
    want = hand_grad_drop(model, clean, corrupted, loss, z_nodes)
    got = attribution_patch_star(model, clean, corrupted, loss, "z", ("layer", "head"))
    assert got.axes == ("layer", "head") and got.name == "z (AtP* |effect|)"
    assert want.min() > 0.01 and want.max() > 0.1  # measured 0.13 to 0.76
    assert (got.values - want).abs().max().item() < 3e-6  # measured 3.0e-7 (values up to 0.76), bound 3e-6: 10x
    keys = attribution_patch_star(model, clean, corrupted, loss, "k", ("layer", "pos", "head"))
    want = hand_grad_drop(model, clean, corrupted, loss, key_nodes)
    assert want.max() > 0.05  # measured 0.54
    assert (keys.values - want).abs().max().item() < 3e-6  # measured 2.6e-7 (values up to 0.54), bound 3e-6: 11x
    # Without the QK fix the keys' magnitudes are AtP's through the dropped gradients: they differ.
    linear = attribution_patch_star(model, clean, corrupted, loss, "k", ("layer", "pos", "head"), qk_fix=False)
    assert (linear.values - want).abs().max().item() > 0.03  # measured 0.34


def test_grad_drop_of_a_layers_own_nodes_is_zero_in_its_own_pass(prompts):
    """A head of block l reaches the metric only through block l's writes: I_l of it is 0, so with
    two layers the score of a layer-0 head is |I_1| alone, which the one-layer-dropped pass gives."""
    clean, corrupted, _ = prompts
    model = build(4, n_layers=2)
    loss = TargetLoss(torch.tensor([5, 17, 23]))
    score = attribution_patch_star(model, clean, corrupted, loss, "z", ("layer", "head"), reduce=None)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
    acts = {}
    keep = lambda act, hook: acts.__setitem__(hook.name, act)
    cut = lambda act, hook: act.detach()
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", keep), ("blocks.1.hook_attn_out", cut),
                                ("blocks.1.hook_mlp_out", cut)]):
        objective = loss(model(corrupted)).sum()
    (grad,) = torch.autograd.grad(objective, [acts["blocks.0.attn.hook_z"]])
    alone = ((clean_cache["blocks.0.attn.hook_z"] - acts["blocks.0.attn.hook_z"].detach()) * grad).sum((1, 3)).abs()
    assert score.axes == ("layer", "head", "batch")
    assert alone.max() > 0.1  # measured 1.9
    assert (score.values[0] - alone.T).abs().max().item() < 4e-6  # measured 3.6e-7 (values up to 1.9), bound 4e-6: 11x


def test_star_errors_and_cleanup(prompts):
    clean, corrupted, metric = prompts
    one_layer = build(0, n_layers=1)
    with pytest.raises(ValueError, match="n_layers=1: use grad_drop=False"):
        attribution_patch_star(one_layer, clean, corrupted, metric, "z", ("layer", "head"))
    model = build(0)
    with pytest.raises(ValueError, match="indexes \\['d_head'\\]"):
        attribution_patch_star(model, clean, corrupted, metric, "q", ("layer", "head", "d_head"))
    with pytest.raises(TypeError, match="grad_drop"):  # the message is typeguard's under the test suite
        attribution_patch_star(model, clean, corrupted, metric, "z", ("layer",), grad_drop="yes")
    with pytest.raises(TypeError, match="belong to method='atp\\*'"):
        attribution_patch(model, clean, corrupted, metric, "z", ("layer",), grad_drop=False)
    olmo = build(0, normalization="RMS", qk_norm="full", n_key_value_heads=1, positional="rotary")
    with pytest.raises(ValueError, match="qk_norm='full'"):
        attribution_patch_star(olmo, clean, corrupted, metric, "k", ("layer", "kv_head"))

    def failing(logits):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        attribution_patch_star(model, clean, corrupted, failing, ["k", "result"], ("layer", "head"))
    assert not model.has_hooks and not model.hook_flags.use_attn_result
