"""The attribution graph's identities, each against an independent computation in the frozen forward:

- every edge equals the change in its target when its source is zeroed in the frozen forward (one
  batched perturbation per source; each class: token, feature and error sources into feature and logit
  targets);
- each target's incoming edges plus its constant term equal its value, the constant term computed as the
  target's value with every node source zeroed;
- values equal the pre-activations and demeaned logits of the clean run;
- no edge runs backwards in layer or position (exact zeros), and excluded positions send nothing.
"""

import pytest
import torch

from glassbox.interp.graphs import ReplacementRun, attribute
from tests.graph_models import family_model, family_transcoders

CASES = [  # family, transcoder kind, prompt
    ("gpt2", dict(), "random"),
    ("gpt2", dict(cross_layer=True), "induction"),
    ("llama", dict(activation="jumprelu", skip=True), "random"),
    ("gemma2", dict(activation="topk", k=6), "induction"),
    ("gptj", dict(cross_layer=True, skip=True), "random"),
]


def prompt_tokens(kind: str, seed: int, d_vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randint(0, d_vocab, (11,), generator=g)
    half = torch.randint(1, d_vocab, (6,), generator=g)
    return torch.cat([torch.zeros(1, dtype=torch.long), half, half])  # a repeated sequence: induction


def target_values(graph, ts, out) -> torch.Tensor:
    """[batch n_targets]: each feature target's pre-activation and each logit's demeaned value in a frozen run."""
    f = graph.active_features
    W = torch.stack([ts.W_enc(l).detach() for l in range(graph.n_layers)])  # [layer d_model d_tc]
    b = torch.stack([ts.b_enc(l).detach() for l in range(graph.n_layers)])
    x = out["inputs"][:, f[:, 0], f[:, 1]]  # [batch n d_model]
    pre = torch.einsum("bnd,nd->bn", x, W[f[:, 0], :, f[:, 2]]) + b[f[:, 0], f[:, 2]]
    last = out["logits"][:, -1]
    return torch.cat([pre, last[:, graph.logit_tokens] - last.mean(-1, keepdim=True)], 1)


def targets(graph) -> torch.Tensor:
    return torch.cat([torch.arange(graph.n_features), torch.arange(graph.logit_start, graph.n_nodes)])


def sources(graph, cap: int = 60) -> list:
    """(class, node index, perturbation) for up to ``cap`` sources of each class."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in torch.randperm(graph.n_features, generator=g)[:cap].tolist():
        out.append(("feature", i, tuple(graph.active_features[i].tolist())))
    errs = [(l, p) for l in range(graph.n_layers) for p in range(graph.exclude_positions, graph.n_pos)]
    for j in torch.randperm(len(errs), generator=g)[:cap].tolist():
        out.append(("error", graph.error_index(*errs[j]), errs[j]))
    for p in range(graph.n_pos):
        out.append(("token", graph.token_index(p), p))
    return out


def perturbed_runs(run, srcs):
    B = len(srcs)
    acts = run.acts.repeat(B, 1, 1, 1)
    errors = run.errors.repeat(B, 1, 1, 1)
    embed = run.embed.repeat(B, 1, 1)
    for b, (kind, _, where) in enumerate(srcs):
        if kind == "feature":
            acts[b][where] = 0
        elif kind == "error":
            errors[b][where] = 0
        else:
            embed[b, where] = 0
    return run.frozen_forward(embed=embed, acts=acts, errors=errors)


# Measured max |edge - perturbation| / max |edge| over these cases (benchmarks/graph_bounds.py): float32 5.3e-7,
# float64 1.1e-15; the values and row sums are checked against the same relative bound.
REL = {torch.float32: 5e-6, torch.float64: 1e-13}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("family,kind,prompt", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_each_edge_is_a_perturbation_and_rows_sum_to_values(family, kind, prompt, dtype):
    model, _ = family_model(family, dtype=dtype)
    ts = family_transcoders(family, dtype=dtype, **kind)
    tokens = prompt_tokens(prompt, 5, model.cfg.d_vocab)
    graph = attribute(model, ts, tokens, batch_size=17)
    assert graph.n_features > 30 and graph.n_logits >= 2
    run = ReplacementRun.capture(model, ts, tokens)
    tgt = targets(graph)
    A = graph.adjacency.double()
    scale = A.abs().max().item()
    with torch.no_grad():
        clean = target_values(graph, ts, run.frozen_forward())[0].double()
        srcs = sources(graph)
        delta = clean[None] - target_values(graph, ts, perturbed_runs(run, srcs)).double()  # [source target]
        zero = run.acts.clone()
        zero[:, graph.exclude_positions:] = 0
        err0 = run.errors.clone()
        err0[:, graph.exclude_positions:] = 0
        constant = target_values(graph, ts, run.frozen_forward(embed=torch.zeros_like(run.embed)[None],
                                                               acts=zero[None], errors=err0[None]))[0].double()
    worst = {}
    for b, (cls, i, _) in enumerate(srcs):
        gap = (delta[b] - A[tgt, i]).abs().max().item() / scale
        worst[cls] = max(worst.get(cls, 0.0), gap)
    assert max(worst.values()) < REL[dtype], f"edges differ from perturbations (relative to max |edge| {scale}): {worst}"
    for cls in ("feature", "error", "token"):  # each class carries real effects, into features and logits
        cols = [i for c, i, _ in srcs if c == cls]
        assert A[:graph.n_features][:, cols].abs().max() > 1e-3 * scale
        assert A[graph.logit_start:][:, cols].abs().max() > 1e-3 * scale
    values = graph.values.double()[tgt]
    assert (values - clean).abs().max().item() < REL[dtype] * clean.abs().max().item()
    rows = A[tgt].sum(1)
    gap = (rows + constant - values).abs().max().item()
    assert gap < REL[dtype] * max(1.0, A[tgt].abs().sum(1).max().item()), f"rows + constants != values by {gap}"
    assert (graph.constants.double()[tgt] - constant).abs().max().item() < REL[dtype] * A[tgt].abs().sum(1).max().item()


@pytest.mark.parametrize("family,kind,prompt", CASES[:3], ids=["gpt2", "gpt2-clt", "llama-skip"])
def test_no_edge_runs_backwards(family, kind, prompt):
    model, _ = family_model(family)
    ts = family_transcoders(family, **kind)
    graph = attribute(model, ts, prompt_tokens(prompt, 6, model.cfg.d_vocab), batch_size=23)
    layers, positions = graph.node_layers_positions()
    A = graph.adjacency
    feat_t = torch.arange(graph.n_features)
    src_is_token = torch.zeros(graph.n_nodes, dtype=torch.bool)
    src_is_token[graph.token_start:graph.logit_start] = True
    later_layer = (layers[None, :] >= layers[feat_t, None]) & ~src_is_token[None, :]
    later_pos = positions[None, :] > positions[feat_t, None]
    assert (A[feat_t][later_layer | later_pos] == 0).all()
    assert (A[graph.error_start:graph.logit_start] == 0).all()  # errors and tokens receive nothing
    assert (A[:, graph.logit_start:] == 0).all()  # logits send nothing
    excluded = (positions < graph.exclude_positions) & (layers >= 0)
    assert (A[:, excluded] == 0).all()  # no node at the excluded position carries an effect
    assert (graph.active_features[:, 1] >= graph.exclude_positions).all()
    # the earlier-layer, earlier-position part is not empty
    assert (A[feat_t][~(later_layer | later_pos)] != 0).float().mean() > 0.3


def test_vmapped_backward_equals_the_expanded_one():
    """``expand=False`` (one batch-1 forward, the backward vmapped over the targets) gives the same graph."""
    model, _ = family_model("llama")
    ts = family_transcoders("llama", cross_layer=True)
    tokens = prompt_tokens("induction", 7, model.cfg.d_vocab)
    a = attribute(model, ts, tokens, batch_size=29)
    b = attribute(model, ts, tokens, batch_size=29, expand=False)
    assert torch.equal(a.active_features, b.active_features)
    # measured max |difference| / max |edge|: 0.0 (identical here); the bound allows another CPU's op order
    assert (a.adjacency - b.adjacency).abs().max() <= 1e-6 * a.adjacency.abs().max()
