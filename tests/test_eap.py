"""EAP and EAP-IG on tiny models, against hand computations and identities that must hold.

Oracles: every edge score rebuilt by hand (sender differences from run_with_cache; the gradient at each
receiver's input from a zero perturbation added there in a forward the test hooks itself; then the dot
product); central finite differences (no autograd); integrated gradients' completeness (the input row of
EAP-IG-inputs sums to M(corrupted) - M(clean), each sender's row of EAP-IG-activations to that sender's
exact patching effect); grouped key/value receivers equal the sum of their ungrouped copies; batch
scores are the mean of single-prompt scores, with padding too. Float64 models: the only rounding left
is the float32 of the scores.
"""

import json
import re

import pytest
import torch

from conftest import perturbed
from glassbox.interp.attribution.eap import eap, interpolation_points
from glassbox.interp.attribution.edges import edge_mask_for, receivers, senders
from glassbox.interp.attribution.graph import Graph
from glassbox.interp.patching import LogitDiff
from glassbox.models import Config, HookedTransformer

GPT2 = Config(d_model=21, n_layers=2, n_heads=3, d_head=5, d_mlp=17, d_vocab=31, n_ctx=13, init_range=0.25)
GQA = Config(d_model=22, n_layers=2, n_heads=4, d_head=6, n_key_value_heads=2, d_mlp=19, d_vocab=31, n_ctx=13,
             normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu", use_bias=False,
             init_range=0.25)
ATTN_ONLY = Config(d_model=15, n_layers=3, n_heads=2, d_head=7, d_vocab=31, n_ctx=13, attn_only=True,
                   init_range=0.3)
N, SEQ = 2, 7
METRIC = LogitDiff(torch.tensor([3, 17]), torch.tensor([29, 8]))
FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")


def tokens(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 31, (N, SEQ), generator=g), torch.randint(0, 31, (N, SEQ), generator=g)


def max_err(graph, expected):
    """The largest |score - expected| over the edges, relative to the largest |expected| score."""
    exists = ~torch.isnan(expected)
    assert torch.equal(torch.isnan(graph.scores), ~exists)
    largest = expected[exists].abs().max().item()
    assert largest > 0.5  # the scores are far from 0
    return (graph.scores.double()[exists] - expected[exists]).abs().max().item() / largest


# --- the test's own map from names to hooks (written independently of edges.py) ------------------
def sender_slice(name, cfg):
    if name == "input":
        return "blocks.0.hook_resid_pre", None
    head = re.fullmatch(r"a(\d+)\.h(\d+)", name)
    if head:
        return f"blocks.{head[1]}.attn.hook_result", int(head[2])
    return f"blocks.{name[1:]}.hook_mlp_out", None


def receiver_slice(name, cfg):
    if name == "logits":
        return f"blocks.{cfg.n_layers - 1}.hook_resid_post", None
    if name.startswith("m"):
        return f"blocks.{name[1:]}.hook_mlp_in", None
    layer, _, index, part = re.fullmatch(r"a(\d+)\.(h|kv)(\d+)\.([qkv])", name).groups()
    return f"blocks.{layer}.hook_{part}_input", int(index)


def model_for(cfg, seed, scale=0.3):
    """A float64 model with random norms and biases, its edge flags on (so hand computations and eap,
    which then changes no flag, share them; flag handling is tested on its own)."""
    model = perturbed(cfg, seed=seed, scale=scale)
    for flag in FLAGS:
        if not (flag == "use_hook_mlp_in" and cfg.attn_only):
            getattr(model, f"set_{flag}")(True)
    return model


def sender_activations(model, toks):
    """name -> [batch pos d_model] for every sender, from run_with_cache."""
    _, cache = model.run_with_cache(toks)
    out = {}
    for name in senders(model.cfg):
        hook, index = sender_slice(name, model.cfg)
        out[name] = cache[hook] if index is None else cache[hook][:, :, index]
    return out


def editing_hooks(copy_edits, mode):
    """Hooks over len(copy_edits) stacked copies of the batch: copy c gets, for each (hook, index, value)
    in copy_edits[c], its slice set to value (mode "set") or shifted by it ("add")."""
    by_hook = {}
    for copy, edits in enumerate(copy_edits):
        for hook, index, value in edits:
            by_hook.setdefault(hook, []).append((copy, index, value))

    def edit(x, hook):
        x = x.clone()
        for copy, index, value in by_hook[hook.name]:
            where = (slice(copy * N, (copy + 1) * N),) + (() if index is None else (slice(None), index))
            x[where] = value if mode == "set" else x[where] + value
        return x
    return [(hook, edit) for hook in by_hook]


def receiver_gradients(model, toks, copy_edits=((),)):
    """Per copy: receiver -> d mean_prompts(metric) / d (its input) [batch pos d_model] on the clean
    tokens with that copy's edits set. One forward over the stacked copies, a zero perturbation added at
    every receiver hook, autograd.grad with respect to the perturbations."""
    cfg = model.cfg
    copies = len(copy_edits)
    names = sorted({receiver_slice(r, cfg)[0] for r in receivers(cfg)})
    zeros = {}

    def add(x, hook):
        zeros[hook.name] = torch.zeros_like(x, requires_grad=True)
        return x + zeros[hook.name]

    hooks = editing_hooks(copy_edits, "set") + [(n, add) for n in names]
    logits = model.run_with_hooks(toks.repeat(copies, 1), fwd_hooks=hooks)
    grads = dict(zip(names, torch.autograd.grad(METRIC(logits).sum() / N, [zeros[n] for n in names])))
    out = []
    for copy in range(copies):
        rows = slice(copy * N, (copy + 1) * N)
        per = {}
        for r in receivers(cfg):
            hook, index = receiver_slice(r, cfg)
            per[r] = grads[hook][rows] if index is None else grads[hook][rows, :, index]
        out.append(per)
    return out


def mean_of(grads):
    return {r: sum(g[r] for g in grads) / len(grads) for r in grads[0]}


def hand_scores(model, clean, corrupted, gradients_for):
    """[sender receiver] float64: Delta_s . gradients_for(s)[r], NaN where no edge exists."""
    cfg = model.cfg
    a_clean, a_corr = sender_activations(model, clean), sender_activations(model, corrupted)
    s_names, r_names = senders(cfg), receivers(cfg)
    exists = edge_mask_for(s_names, r_names)
    out = torch.full((len(s_names), len(r_names)), float("nan"), dtype=torch.float64)
    for i, s in enumerate(s_names):
        grads = gradients_for(s)
        for j, r in enumerate(r_names):
            if exists[i, j]:
                out[i, j] = ((a_corr[s] - a_clean[s]) * grads[r]).sum()
    return out


@pytest.mark.parametrize("cfg", [GPT2, GQA, ATTN_ONLY], ids=["gpt2", "gqa", "attn_only"])
def test_eap_equals_its_definition_by_hand(cfg):
    model = model_for(cfg, seed=3)
    clean, corrupted = tokens()
    graph = eap(model, clean, corrupted, METRIC)
    grads = receiver_gradients(model, clean)[0]
    assert graph.senders == senders(cfg) and graph.receivers == receivers(cfg)
    err = max_err(graph, hand_scores(model, clean, corrupted, lambda s: grads))
    # measured 2.4e-8 gpt2, 2.9e-8 gqa, 4.2e-8 attn_only (relative to the largest score, 1.4 to 4.0: the
    # float32 rounding of the scores, at most 2**-24 = 6e-8), bound 4e-7: 10x
    assert err < 4e-7, err
    assert not model.has_hooks
    assert all(p.grad is None for p in model.parameters())


def test_eap_matches_central_finite_differences():
    """No autograd: (M(x_r + eps Delta_s) - M(x_r - eps Delta_s)) / (2 eps) at the receiver's input,
    every shifted run a copy of the batch in one forward."""
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens()
    graph = eap(model, clean, corrupted, METRIC)
    a_clean, a_corr = sender_activations(model, clean), sender_activations(model, corrupted)
    edges = [("input", "a0.h1.k"), ("a0.h2", "a1.h0.q"), ("m0", "a1.h2.v"), ("a0.h0", "m0"), ("m1", "logits"),
             ("input", "logits"), ("a1.h1", "m1")]
    eps = 2e-5
    copy_edits = [[(*receiver_slice(r, GPT2), sign * eps * (a_corr[s] - a_clean[s]))]
                  for s, r in edges for sign in (1, -1)]
    with torch.no_grad():
        logits = model.run_with_hooks(clean.repeat(len(copy_edits), 1), fwd_hooks=editing_hooks(copy_edits, "add"))
    values = METRIC(logits).reshape(len(copy_edits), N).mean(1)
    errs = []
    for k, (s, r) in enumerate(edges):
        fd = (values[2 * k] - values[2 * k + 1]).item() / (2 * eps)
        errs.append(abs(graph.score(s, r) - fd))
    # measured 6.7e-9 (the float32 rounding of scores up to 0.86; eps^2 truncation is below it), bound 1e-7: 15x
    assert max(errs) < 1e-7, errs
    assert sum(abs(graph.score(s, r)) > 1e-3 for s, r in edges) >= 5


def embeddings(model, clean, corrupted):
    with torch.no_grad():
        return (model.run_with_cache(clean)[1]["blocks.0.hook_resid_pre"],
                model.run_with_cache(corrupted)[1]["blocks.0.hook_resid_pre"])


@pytest.mark.parametrize("points", ["paper", "midpoint"])
def test_eap_ig_inputs_equals_its_definition_by_hand(points):
    model = model_for(GQA, seed=4)
    clean, corrupted = tokens(2)
    m = 3
    ts = [(k - 1) / m for k in range(1, m + 1)] if points == "paper" else [(k - 0.5) / m for k in range(1, m + 1)]
    assert interpolation_points(m, points) == pytest.approx(ts, abs=1e-15)
    graph = eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=m, points=points)
    e_clean, e_corr = embeddings(model, clean, corrupted)
    grads = mean_of(receiver_gradients(
        model, clean, [[("blocks.0.hook_resid_pre", None, e_clean + t * (e_corr - e_clean))] for t in ts]))
    err = max_err(graph, hand_scores(model, clean, corrupted, lambda s: grads))
    # measured 3.2e-8 paper, 1.5e-8 midpoint (relative to the largest score, 1.6 and 2.6), bound 3e-7: 10x
    assert err < 3e-7, err
    # two passes (2 + 1 copies), or three (a budget of 1 byte still runs one copy per pass)
    split = eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=m, points=points,
                **({"steps_per_pass": 2} if points == "paper" else {"memory_budget": 1}))
    # measured 0 (float64 sums over another batch layout); bound 5e-7, a few float32 ulps of scores up to 2.6
    assert (split.scores - graph.scores).abs().nan_to_num().max() < 5e-7


def test_eap_ig_activations_equals_its_definition_by_hand():
    model = model_for(GPT2, seed=5)
    clean, corrupted = tokens(3)
    ts = interpolation_points(2, "midpoint")
    a_clean, a_corr = sender_activations(model, clean), sender_activations(model, corrupted)
    names = senders(GPT2)
    copy_edits = [[(*sender_slice(s, GPT2), a_clean[s] + t * (a_corr[s] - a_clean[s]))] for s in names for t in ts]
    per_copy = receiver_gradients(model, clean, copy_edits)
    by_sender = {s: mean_of(per_copy[i * len(ts):(i + 1) * len(ts)]) for i, s in enumerate(names)}
    graph = eap(model, clean, corrupted, METRIC, method="EAP-IG-activations", steps=2, points="midpoint")
    err = max_err(graph, hand_scores(model, clean, corrupted, by_sender.__getitem__))
    # measured 1.7e-8 (relative to the largest score, 3.6), bound 2e-7: 12x
    assert err < 2e-7, err
    three_per_pass = eap(model, clean, corrupted, METRIC, method="EAP-IG-activations", steps=2, points="midpoint",
                         steps_per_pass=3)
    # measured 0; bound 1e-6, a few float32 ulps of scores up to 3.6
    assert (three_per_pass.scores - graph.scores).abs().nan_to_num().max() < 1e-6


def test_one_step_at_the_clean_end_is_eap():
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens()
    base = eap(model, clean, corrupted, METRIC)
    for method in ("EAP-IG-inputs", "EAP-IG-activations"):
        one = eap(model, clean, corrupted, METRIC, method=method, steps=1, points="paper")
        # measured 0 (the same gradient at the same point); bound 5e-7, a few float32 ulps of scores up to 1.4
        assert (one.scores - base.scores).abs().nan_to_num().max() < 5e-7
        assert torch.equal(torch.isnan(one.scores), torch.isnan(base.scores))
        assert one.metadata["steps"] == 1 and one.metadata["method"] == method


def exact_sender_patches(model, clean, corrupted):
    """Per sender: M(clean run with that sender's output set to its corrupted value) - M(clean), one
    copy of the batch per sender in one forward."""
    names = senders(model.cfg)
    a_corr = sender_activations(model, corrupted)
    copy_edits = [[(*sender_slice(s, model.cfg), a_corr[s])] for s in names]
    with torch.no_grad():
        patched = METRIC(model.run_with_hooks(clean.repeat(len(names), 1), fwd_hooks=editing_hooks(copy_edits, "set")))
        base = METRIC(model(clean)).mean()
    return patched.reshape(len(names), N).mean(1) - base


def test_ig_converges_and_is_complete():
    """|score_m - score_2m| shrinks as m doubles (halving at the paper points, quartering at midpoints);
    the input row of EAP-IG-inputs sums to M(corrupted) - M(clean), and each sender's row of
    EAP-IG-activations to that sender's exact patching effect, ever closer as m grows."""
    model = model_for(GPT2, seed=3, scale=0.1)
    clean, corrupted = tokens()
    with torch.no_grad():
        total = (METRIC(model(corrupted)).mean() - METRIC(model(clean)).mean()).item()
    for points, low, high in (("paper", 0.4, 0.65), ("midpoint", 0.15, 0.32)):
        graphs = {m: eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=m, points=points)
                  for m in (16, 32, 64)}
        diffs = [(graphs[m].scores - graphs[2 * m].scores).abs().nan_to_num().max().item() for m in (16, 32)]
        # measured: paper 0.105 then 0.054 (ratio 0.51, the 1/m of a one-sided rule); midpoint 4.8e-3
        # then 1.1e-3 (ratio 0.23, the 1/m^2 of the midpoint rule). The bands test the order of convergence of
        # a float64 quadrature (rounding ~1e-13 here), a property of the rule, not a float bound.
        assert low < diffs[1] / diffs[0] < high, (points, diffs)
        gaps = [abs(graphs[m].scores[0].double().nansum().item() - total) for m in (16, 32, 64)]
        assert gaps == sorted(gaps, reverse=True), gaps
    # midpoint completeness gaps: measured 7.6e-3, 1.8e-3, 4.4e-4 at m = 16, 32, 64 (M(corrupted) -
    # M(clean) = -0.90): each quarter of the last; bounds: a third, and 4.4e-3 at m=64 (10x)
    assert gaps[2] < gaps[1] / 3 and gaps[2] < 4.4e-3, gaps
    exact = exact_sender_patches(model, clean, corrupted)
    act = {m: eap(model, clean, corrupted, METRIC, method="EAP-IG-activations", steps=m, points="midpoint")
           for m in (4, 32)}
    errs = [(act[m].scores.double().nansum(1) - exact).abs().max().item() for m in (4, 32)]
    # measured 0.12 at m=4, 1.8e-3 at m=32 (exact effects up to 2.8); bounds: a tenth, and 1.8e-2 (10x)
    assert errs[1] < errs[0] / 10 and errs[1] < 1.8e-2, errs
    # the input row of both IG methods is the same integral
    # measured 0; bound 1e-6, a few float32 ulps of scores up to 2.4
    assert (act[32].scores[0] - graphs[32].scores[0]).abs().nan_to_num().max() < 1e-6


def test_grouped_kv_receivers_are_the_sum_of_their_ungrouped_copies():
    """Ungrouped (ungroup_grouped_query_attention) each query head reads its own copy of the key/value
    input; grouped, the kv head's one input feeds the whole group: its gradient, and so every edge score
    into it, is the sum over the group's copies. Query, MLP and logits receivers are unchanged."""
    grouped = model_for(GQA, seed=6)
    ungrouped = model_for(GQA.replace(ungroup_grouped_query_attention=True), seed=0)
    ungrouped.load_state_dict(grouped.state_dict())
    clean, corrupted = tokens(5)
    g, u = eap(grouped, clean, corrupted, METRIC), eap(ungrouped, clean, corrupted, METRIC)
    assert g.senders == u.senders
    assert [r for r in g.receivers if ".kv" in r] == [f"a{L}.kv{G}.{p}" for L in range(2) for p in "kv"
                                                      for G in range(2)]
    assert len(u.receivers) == len(g.receivers) + 2 * 2 * 2
    col = u.receivers.index
    for j, name in enumerate(g.receivers):
        if ".kv" in name:
            layer, group, part = re.fullmatch(r"a(\d)\.kv(\d)\.([kv])", name).groups()
            heads = [h for h in range(4) if h // 2 == int(group)]
            expected = sum(u.scores[:, col(f"a{layer}.h{h}.{part}")].double() for h in heads)
        else:
            expected = u.scores[:, col(name)].double()
        got = g.scores[:, j].double()
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), name
        # measured 2.2e-8 on kv receivers (up to 0.79), 0 elsewhere (float32 rounding of the terms), bound 2.5e-7
        assert (got - expected).abs().nan_to_num().max() < 2.5e-7, name
    assert g.scores[:, [j for j, r in enumerate(g.receivers) if ".kv" in r]].abs().nan_to_num().max() > 0.5


@pytest.mark.parametrize("method,fail_at", [("EAP", 2), ("EAP-IG-inputs", 3), ("EAP-IG-activations", 4)])
def test_flags_and_hooks_are_restored_when_something_fails(method, fail_at):
    model = perturbed(GPT2, seed=3)
    model.set_use_attn_in(True)  # eap must turn it off (it excludes the split inputs) and back on
    before = model.hook_flags.as_dict()
    calls = []

    def failing(logits):
        calls.append(1)
        if len(calls) == fail_at:  # inside a gradient pass, with every flag and hook in place
            raise RuntimeError("metric failed")
        return METRIC(logits)

    steps = None if method == "EAP" else 2
    with pytest.raises(RuntimeError, match="metric failed"):
        eap(model, *tokens(), failing, method=method, steps=steps, steps_per_pass=1)
    assert model.hook_flags.as_dict() == before and not model.has_hooks
    with pytest.raises(ValueError, match=r"one value per batch row, shape \(2,\); got \(\)"):
        eap(model, *tokens(), lambda logits: METRIC(logits).mean(), method=method, steps=steps)
    assert model.hook_flags.as_dict() == before and not model.has_hooks
    graph = eap(model, *tokens(), METRIC, method=method, steps=steps)
    assert model.hook_flags.as_dict() == before and not model.has_hooks
    assert torch.equal(torch.isnan(graph.scores), ~graph.edge_mask())


@pytest.mark.parametrize("changes,match", [
    ({"norm_placement": "post"}, "Config.norm_placement='post'"),
    ({"norm_placement": "sandwich"}, "Config.norm_placement='sandwich'"),
    ({"norm_placement": "output"}, "Config.norm_placement='output'"),
    ({"parallel_attn_mlp": True}, "Config.parallel_attn_mlp=True"),
])
def test_refuses_models_the_edge_graph_cannot_describe(changes, match):
    model = HookedTransformer(GPT2.replace(**changes))
    with pytest.raises(ValueError, match=re.escape(match)):
        eap(model, *tokens(), METRIC)
    assert not any(model.hook_flags.as_dict().values()) and not model.has_hooks


def test_refuses_bad_arguments_by_name():
    model = perturbed(GPT2, seed=3)
    clean, corrupted = tokens()
    for kwargs, match in [({"method": "ACDC"}, "method must be one of"), ({"steps": 3}, "EAP takes one gradient"),
                          ({"method": "EAP-IG-inputs", "steps": 0}, "steps must be a positive int"),
                          ({"method": "EAP-IG-inputs", "points": "left"}, "points must be one of"),
                          ({"method": "EAP-IG-inputs", "steps_per_pass": 0}, "steps_per_pass must be"),
                          ({"method": "EAP-IG-inputs", "memory_budget": 0}, "memory_budget must be"),
                          ({"attention_mask": torch.ones(2, 6)}, "attention_mask must be a \\[batch pos\\]")]:
        with pytest.raises(ValueError, match=match):
            eap(model, clean, corrupted, METRIC, **kwargs)
    with pytest.raises(ValueError, match="must have the same shape"):
        eap(model, clean, corrupted[:, :5], METRIC)
    with pytest.raises(ValueError, match="corrupted_tokens must be a \\[batch pos\\] tensor of token ids"):
        eap(model, clean, corrupted.double(), METRIC)
    assert not any(model.hook_flags.as_dict().values()) and not model.has_hooks


@pytest.mark.parametrize("method", ["EAP", "EAP-IG-inputs"])
def test_batch_scores_are_the_mean_of_single_prompt_scores_with_padding(method):
    """The gradient is of the prompt mean, so a batch's scores are the mean of each prompt's alone; the
    second prompt is 5 tokens, left-padded (without the mask the scores move by 1.3)."""
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens(4)
    mask = torch.ones(N, SEQ, dtype=torch.long)
    mask[1, :2] = 0
    steps = None if method == "EAP" else 3
    batch = eap(model, clean, corrupted, METRIC, method=method, steps=steps, attention_mask=mask)
    first = eap(model, clean[:1], corrupted[:1], LogitDiff(3, 29), method=method, steps=steps)
    second = eap(model, clean[1:, 2:], corrupted[1:, 2:], LogitDiff(17, 8), method=method, steps=steps)
    expected = (first.scores.double() + second.scores.double()) / 2
    assert torch.equal(torch.isnan(batch.scores), torch.isnan(expected))
    assert expected.abs().nan_to_num().max() > 0.5
    # measured 7.5e-8 EAP, 6.0e-8 IG (scores up to 1.4; float32 rounding of three graphs), bound 7.5e-7: 10x
    assert (batch.scores.double() - expected).abs().nan_to_num().max() < 7.5e-7
    text = json.dumps(batch.to_json(), allow_nan=False)  # the metadata is plain JSON
    assert Graph.from_json(json.loads(text)).metadata == batch.metadata


def test_frozen_parameters_and_progress_bar():
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens()
    base = eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=2)
    model.requires_grad_(False)
    frozen = eap(model, clean, corrupted, METRIC, method="EAP-IG-inputs", steps=2, progress=True, steps_per_pass=1)
    # measured 0: the same forwards, only which leaves need grad differs; bound 5e-7 (float32 ulps of 1.4)
    assert (frozen.scores - base.scores).abs().nan_to_num().max() < 5e-7
    assert torch.equal(torch.isnan(frozen.scores), torch.isnan(base.scores))


def test_refuses_inference_mode_but_runs_under_no_grad():
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens()
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode"):
        eap(model, clean, corrupted, METRIC)
    with torch.no_grad():
        graph = eap(model, clean, corrupted, METRIC)
    assert graph.scores.abs().nan_to_num().max() > 0.5


def test_hooks_left_on_the_model_are_part_of_the_model():
    """A hook the caller attached (here: head 1 of layer 0 zeroed at hook_z) runs in every pass: that
    head's edges carry no difference, and every score still equals the hand computation on the hooked
    model."""
    model = model_for(GPT2, seed=3)
    clean, corrupted = tokens()

    def zero_head(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    model.add_hook("blocks.0.attn.hook_z", zero_head)
    try:
        graph = eap(model, clean, corrupted, METRIC)
        grads = receiver_gradients(model, clean)[0]
        err = max_err(graph, hand_scores(model, clean, corrupted, lambda s: grads))
        assert len(model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks) == 1  # eap removed only its own hooks
    finally:
        model.reset_hooks()
    row = graph.scores[graph.senders.index("a0.h1")]
    assert torch.equal(row.nan_to_num(0.0), torch.zeros_like(row))
    # measured 3.0e-8 (relative to the largest score; float32 rounding), bound 4e-7: 13x
    assert err < 4e-7, err
    # without the hook that head's edges score up to 1.3
    assert eap(model, clean, corrupted, METRIC).scores[graph.senders.index("a0.h1")].abs().nan_to_num().max() > 0.5
