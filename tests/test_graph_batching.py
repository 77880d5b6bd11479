"""The attribution's batching and its cost contract:

- each batch of feature targets runs one forward at batch 1 over only the positions up to its last
  target's and the blocks up to its layer (the logit targets one over the whole prompt), counted by hooks
  on the model, against the schedule computed by hand from the graph's active features;
- the graph does not depend on the batch size or on ``expand`` (measured bound);
- a prefix of the replacement run reproduces the whole run cut to it (causality), and its arguments are
  checked by name.
"""

import pytest
import torch

from glassbox.interp.graphs import ReplacementRun, attribute
from tests.graph_models import N_LAYERS, family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens


def record_forwards(model) -> list:
    """Hooks that note, per forward, [batch, n_pos, blocks run, reached the unembedding]."""
    runs = []

    def start(value, hook):
        runs.append([value.shape[0], value.shape[1], 1, False])

    def block(layer):
        def hook(value, hook):
            runs[-1][2] = layer + 1
        return hook

    def unembed(value, hook):
        runs[-1][3] = True

    model.add_hook("blocks.0.hook_resid_pre", start)
    for l in range(1, N_LAYERS):
        model.add_hook(f"blocks.{l}.hook_resid_pre", block(l))
    model.add_hook("unembed.hook_in", unembed)
    return runs


def expected_schedule(graph, batch_size: int) -> list:
    """By hand: the capture and the logit targets over the whole prompt, then per layer, chunks of
    ``batch_size`` features in graph order, each up to its last feature's position and its layer."""
    P, L = graph.n_pos, graph.n_layers
    out = [[1, P, L, True], [1, P, L, True]]
    feats = graph.active_features.tolist()
    for layer in range(L):
        mine = [f for f in feats if f[0] == layer]
        for i in range(0, len(mine), batch_size):
            chunk = mine[i:i + batch_size]
            out.append([1, max(f[1] for f in chunk) + 1, layer + 1, False])
    return out


@pytest.mark.parametrize("family,kind,batch_size", [("gpt2", dict(), 9), ("gpt2", dict(), 64),
                                                     ("gptj", dict(cross_layer=True, skip=True), 64)])
def test_each_batch_runs_only_its_prefix_and_layers(family, kind, batch_size):
    model, _ = family_model(family)
    ts = family_transcoders(family, **kind)
    tokens = prompt_tokens("random", 3, model.cfg.d_vocab)
    runs = record_forwards(model)
    try:
        graph = attribute(model, ts, tokens, batch_size=batch_size)
    finally:
        model.reset_hooks()
    assert graph.n_features > 20 and graph.n_logits >= 1
    assert runs == expected_schedule(graph, batch_size)


# Measured max |difference| / max |edge| against batch_size=64 over these cases: 6.5e-9 (float32; batch size
# 16, vmapped and expand=True); the bound leaves 15x for another CPU's op order.
BATCH_BOUND = 1e-7


@pytest.mark.parametrize("family,kind,prompt", [
    ("gpt2", dict(cross_layer=True), "induction"),
    ("llama", dict(activation="jumprelu", skip=True), "random"),
    ("gptj", dict(cross_layer=True, skip=True), "random"),
])
def test_graph_does_not_depend_on_the_batching(family, kind, prompt):
    model, _ = family_model(family)
    ts = family_transcoders(family, **kind)
    tokens = prompt_tokens(prompt, 5, model.cfg.d_vocab)
    ref = attribute(model, ts, tokens, batch_size=64)
    scale = ref.adjacency.abs().max()
    assert scale > 0
    for kwargs in (dict(batch_size=16), dict(batch_size=16, expand=True)):
        other = attribute(model, ts, tokens, **kwargs)
        assert torch.equal(other.active_features, ref.active_features), kwargs
        assert torch.equal(other.values, ref.values), kwargs
        gap = (other.adjacency - ref.adjacency).abs().max()
        assert gap <= BATCH_BOUND * scale, (kwargs, float(gap / scale))


# Measured max |prefix - whole| / max |value| (logits and transcoder inputs) over these families: 4.3e-7
# (float32); 10x headroom.
PREFIX_BOUND = 4e-6


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "gptj", "postnorm"])
def test_a_prefix_reproduces_the_whole_run_cut_to_it(family):
    model, _ = family_model(family)
    ts = family_transcoders(family)
    run = ReplacementRun.capture(model, ts, prompt_tokens("random", 7, model.cfg.d_vocab))
    whole = run.frozen_forward()
    for n in (1, 4, 10):
        part = run.prefix(n).frozen_forward()
        scale = whole["logits"][:, :n].abs().max()
        assert part["logits"].shape == (1, n, model.cfg.d_vocab)
        gap = (part["logits"] - whole["logits"][:, :n]).abs().max()
        assert gap <= PREFIX_BOUND * scale, (n, float(gap / scale))
        assert (part["inputs"] - whole["inputs"][:, :, :n]).abs().max() <= PREFIX_BOUND * whole["inputs"].abs().max()
    short = run.prefix(4).frozen_forward(stop_at_layer=2)
    assert short["logits"] is None and "final" not in short and short["inputs"].shape[1] == 2


def test_prefix_and_stop_refuse_bad_values_by_name():
    model, _ = family_model("gpt2")
    ts = family_transcoders("gpt2")
    run = ReplacementRun.capture(model, ts, prompt_tokens("random", 7, model.cfg.d_vocab))
    for bad in (0, 12, -1, True):
        with pytest.raises(ValueError, match="n_pos"):
            run.prefix(bad)
    with pytest.raises(ValueError, match="stop_at_layer"):
        run.frozen_forward(stop_at_layer=0)
    with pytest.raises(ValueError, match="stop_at_layer"):
        run.frozen_forward(stop_at_layer=N_LAYERS + 1)
    assert not model.has_hooks
