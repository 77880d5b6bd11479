"""glassbox's own attribution graph (``glassbox.interp.graphs``) against circuit-tracer's on TransformerLens
3.2.1 (the ``transformer_lens`` dumps of ``conftest.graphs``), on the same model folder, the same
transcoder folders (read by glassbox's ``load_circuit_tracer``) and circuit-tracer's token ids (its BOS
prepended): every case of ``conftest.CASES`` (per-layer ReLU and JumpReLU+skip, cross-layer; text and
induction prompts). The node set and order, logit tokens, adjacency, activations and pruning masks
must agree.

glassbox's ``attribute`` takes the ``TranscoderSet`` that ``load_circuit_tracer`` reads, as it is.
"""

import pytest
import torch

from conftest import CASES, PRUNE


@pytest.mark.parametrize("name", list(CASES))
def test_glassbox_graph_equals_circuit_tracer(graphs, name):
    import glassbox
    from glassbox.interp.graphs import attribute
    from glassbox.interp.graphs.prune import prune_graph
    from glassbox.interp.transcoders.circuit_tracer import load_circuit_tracer

    kind, _, _, dtype_name = CASES[name]
    dtype = getattr(torch, dtype_name)
    ref = graphs["results"]["transformer_lens", name]
    model = glassbox.HookedTransformer.from_pretrained(str(graphs["model_dir"]), dtype=dtype)
    ts = load_circuit_tracer(graphs["root"] / f"tc_{kind}", dtype=dtype)
    graph = attribute(model, ts, ref["input_tokens"], max_n_logits=10, desired_logit_prob=0.95)
    assert torch.equal(graph.tokens.cpu(), ref["input_tokens"])
    assert torch.equal(graph.active_features.cpu(), ref["active_features"]), name
    assert torch.equal(graph.logit_tokens.cpu(), ref["logit_token_ids"]), name
    assert graph.n_nodes == ref["adjacency_matrix"].shape[0]
    # Relative to the largest entry; measured over the 8 cases at most 7.7e-7 (adjacency), 6.2e-7
    # (activations), 1.4e-6 (probabilities); the float64 case 4.7e-8, 2.3e-8, 2.5e-8 (circuit-tracer
    # stores its adjacency in float32 and TransformerLens 3.2.1 is float32-limited, see test_ct_oracle);
    # bounds 4e-6, 4e-6, 1e-5.
    for ours, theirs, what, bound in ((graph.adjacency, ref["adjacency_matrix"], "adjacency", 4e-6),
                                      (graph.activation_values, ref["activation_values"], "activations", 4e-6),
                                      (graph.logit_probabilities, ref["logit_probabilities"], "logit probabilities", 1e-5)):
        gap = float((ours.detach().double().cpu() - theirs.double()).abs().max() / theirs.double().abs().max())
        assert gap < bound, f"{name}: {what} relative gap {gap:.2e}"
    for pair in PRUNE:
        node_threshold, edge_threshold = (float(x) for x in pair.split(","))
        result = prune_graph(graph, node_threshold, edge_threshold)
        for mask in ("node_mask", "edge_mask"):
            assert torch.equal(getattr(result, mask).cpu(), ref["pruning"][pair][mask]), f"{name}: {mask} at {pair}"
