"""The edge graph: sender/receiver names, which edges exist, the Graph object, circuits and JSON.

Oracles: name lists written out by hand for tiny configs, edge counts from a closed-form count,
the models' own hook_dict (every sender/receiver hook exists, with the head axis it indexes), and
JSON round trips that must be bit-exact.
"""

import json

import pytest
import torch

from glassbox.interp.attribution.edges import (edge_exists, edge_mask_for, kv_is_grouped, receiver_hook,
                                               receiver_node, receivers, sender_hook, senders)
from glassbox.interp.attribution.graph import Graph
from glassbox.models import Config, HookedTransformer

GPT2_TINY = Config(d_model=14, n_layers=2, n_heads=2, d_vocab=11, n_ctx=7)
GQA_TINY = Config(d_model=24, n_layers=2, n_heads=4, d_head=6, n_key_value_heads=2, d_vocab=13, n_ctx=7,
                  normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu", use_bias=False)


def test_names_by_hand_gpt2():
    assert senders(GPT2_TINY) == ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1"]
    assert receivers(GPT2_TINY) == [
        "a0.h0.q", "a0.h1.q", "a0.h0.k", "a0.h1.k", "a0.h0.v", "a0.h1.v", "m0",
        "a1.h0.q", "a1.h1.q", "a1.h0.k", "a1.h1.k", "a1.h0.v", "a1.h1.v", "m1", "logits"]


def test_names_by_hand_gqa_and_attn_only():
    assert kv_is_grouped(GQA_TINY) and not kv_is_grouped(GPT2_TINY)
    assert receivers(GQA_TINY)[:11] == [
        "a0.h0.q", "a0.h1.q", "a0.h2.q", "a0.h3.q", "a0.kv0.k", "a0.kv1.k", "a0.kv0.v", "a0.kv1.v", "m0",
        "a1.h0.q", "a1.h1.q"]
    ungrouped = GQA_TINY.replace(ungroup_grouped_query_attention=True)
    assert not kv_is_grouped(ungrouped)
    assert "a0.h3.k" in receivers(ungrouped) and "a0.kv0.k" not in receivers(ungrouped)
    attn_only = GPT2_TINY.replace(attn_only=True)
    assert senders(attn_only) == ["input", "a0.h0", "a0.h1", "a1.h0", "a1.h1"]
    assert receivers(attn_only) == ["a0.h0.q", "a0.h1.q", "a0.h0.k", "a0.h1.k", "a0.h0.v", "a0.h1.v",
                                    "a1.h0.q", "a1.h1.q", "a1.h0.k", "a1.h1.k", "a1.h0.v", "a1.h1.v", "logits"]


@pytest.mark.parametrize("sender,receiver,expected", [
    ("input", "a0.h0.q", True), ("input", "m0", True), ("input", "logits", True),
    ("a0.h1", "a0.h0.q", False), ("a0.h1", "a0.h1.v", False), ("a0.h1", "m0", True), ("a0.h1", "a1.kv0.k", True),
    ("m0", "m0", False), ("m0", "a0.h0.k", False), ("m0", "a1.h0.k", True), ("m1", "a1.h0.q", False),
    ("m1", "logits", True), ("a10.h3", "a9.h0.q", False), ("a9.h0", "a10.h3.q", True), ("m9", "m10", True),
])
def test_edge_exists_by_hand(sender, receiver, expected):
    assert edge_exists(sender, receiver) is expected


@pytest.mark.parametrize("bad", ["a0", "h0", "a0.h0.q", "m", "inputs", "logits", "a0.hx"])
def test_bad_sender_names_refused(bad):
    with pytest.raises(ValueError, match="not a sender name"):
        edge_exists(bad, "logits")


@pytest.mark.parametrize("bad", ["a0.h0", "a0.h0.z", "a0.kv0.q", "input", "logit", "m0.q"])
def test_bad_receiver_names_refused(bad):
    with pytest.raises(ValueError, match="not a receiver name"):
        edge_exists("input", bad)


@pytest.mark.parametrize("cfg", [GPT2_TINY, GQA_TINY, GPT2_TINY.replace(attn_only=True),
                                 Config(d_model=15, n_layers=3, n_heads=5, d_vocab=7, n_ctx=5)])
def test_edge_count_closed_form_and_mask_matches_edge_exists(cfg):
    n_layers, n_heads = cfg.n_layers, cfg.n_heads
    n_kv = cfg.n_key_value_heads
    mlp = 0 if cfg.attn_only else 1
    per_layer_senders = n_heads + mlp
    # receivers of layer L read 1 + L*(heads+mlp) senders (attention) or that plus layer L's heads (MLP)
    expected = sum((n_heads + 2 * n_kv) * (1 + layer * per_layer_senders)
                   + mlp * (1 + layer * per_layer_senders + n_heads) for layer in range(n_layers))
    expected += 1 + n_layers * per_layer_senders  # logits
    s, r = senders(cfg), receivers(cfg)
    mask = edge_mask_for(s, r)
    assert int(mask.sum()) == expected
    loop = torch.tensor([[edge_exists(a, b) for b in r] for a in s])
    assert torch.equal(mask, loop)


@pytest.mark.parametrize("cfg", [GPT2_TINY, GQA_TINY])
def test_hooks_exist_in_the_model_with_the_indexed_axis(cfg):
    model = HookedTransformer(cfg)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    for name in senders(cfg):
        hook, index = sender_hook(name, cfg)
        assert hook in model.hook_dict, name
        if index is not None:
            assert index < cache[hook].shape[2]
            assert cache[hook].shape[2] == cfg.n_heads
    for name in receivers(cfg):
        hook, index = receiver_hook(name, cfg)
        assert hook in model.hook_dict, name
        if index is not None:
            assert index < cache[hook].shape[2], name
    assert receiver_hook("a1.kv1.v", GQA_TINY) == ("blocks.1.hook_v_input", 1)
    assert cache["blocks.1.hook_v_input"].shape[2] == 2
    assert receiver_hook("logits", cfg) == (f"blocks.{cfg.n_layers - 1}.hook_resid_post", None)


def test_hook_lookups_refuse_names_the_model_lacks():
    with pytest.raises(ValueError, match="grouped key/value"):
        receiver_hook("a0.h0.k", GQA_TINY)
    with pytest.raises(ValueError, match="one key/value input per head"):
        receiver_hook("a0.kv0.k", GPT2_TINY)
    with pytest.raises(ValueError, match="kv head 2 is out of range"):
        receiver_hook("a0.kv2.v", GQA_TINY)
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        sender_hook("m2", GPT2_TINY)
    with pytest.raises(ValueError, match="attention-only"):
        receiver_hook("m0", GPT2_TINY.replace(attn_only=True))


def test_receiver_node():
    assert [receiver_node(n) for n in ("a1.h0.q", "a1.kv0.k", "m1", "logits")] == ["a1.h0", "a1.kv0", "m1", "logits"]


def small_graph() -> Graph:
    """A graph on GPT2_TINY with hand-placed scores on a few edges, the rest 0."""
    s, r = senders(GPT2_TINY), receivers(GPT2_TINY)
    scores = torch.where(edge_mask_for(s, r), 0.0, float("nan"))
    placed = {("m0", "logits"): -5.0, ("a0.h1", "a1.h0.k"): 3.0, ("input", "m1"): 3.0, ("a1.h1", "m1"): 1.5,
              ("input", "a0.h0.q"): -0.25}
    for (a, b), value in placed.items():
        scores[s.index(a), r.index(b)] = value
    return Graph(s, r, scores, {"method": "hand", "steps": None})


def test_edges_sorted_ties_in_forward_order_nan_last():
    g = small_graph()
    g.scores[g.senders.index("m1"), g.receivers.index("logits")] = float("nan")
    edges = g.edges()
    assert len(edges) == g.n_edges == 46
    assert edges[:5] == [("m0", "logits", -5.0), ("input", "m1", 3.0), ("a0.h1", "a1.h0.k", 3.0),
                         ("a1.h1", "m1", 1.5), ("input", "a0.h0.q", -0.25)]
    assert edges[-1][:2] == ("m1", "logits") and edges[-1][2] != edges[-1][2]
    signed = g.edges(absolute=False)
    assert signed[0] == ("input", "m1", 3.0) and signed[-2] == ("m0", "logits", -5.0)


def test_top_k_threshold_and_nodes():
    g = small_graph()
    top = g.top_k(3)
    assert g.in_circuit is None  # a copy; the original is unchanged
    chosen = {(g.senders[a], g.receivers[b]) for a, b in top.in_circuit.nonzero().tolist()}
    assert chosen == {("m0", "logits"), ("input", "m1"), ("a0.h1", "a1.h0.k")}
    assert top.nodes_in_circuit() == ["input", "a0.h1", "m0", "a1.h0", "m1", "logits"]
    assert int(g.top_k(0).in_circuit.sum()) == 0
    assert int(g.top_k(46).in_circuit.sum()) == 46
    signed = {(g.senders[a], g.receivers[b]) for a, b in g.top_k(2, absolute=False).in_circuit.nonzero().tolist()}
    assert signed == {("input", "m1"), ("a0.h1", "a1.h0.k")}
    at = {(g.senders[a], g.receivers[b]) for a, b in g.threshold(3.0).in_circuit.nonzero().tolist()}
    assert at == chosen  # >= t
    assert int(g.threshold(0.0, absolute=False).in_circuit.sum()) == 46 - 2
    assert int(g.threshold(5.0 + 1e-6).in_circuit.sum()) == 0
    with pytest.raises(ValueError, match="more than the 46 scored edges"):
        g.top_k(47)
    with pytest.raises(ValueError, match="non-negative int"):
        g.top_k(-1)
    with pytest.raises(ValueError, match="no circuit"):
        g.nodes_in_circuit()


def test_construction_refuses_inconsistent_graphs():
    s, r = senders(GPT2_TINY), receivers(GPT2_TINY)
    mask = edge_mask_for(s, r)
    with pytest.raises(ValueError, match="shape"):
        Graph(s, r, torch.zeros(len(s), len(r) - 1))
    with pytest.raises(ValueError, match=r"\('a0.h0' -> 'a0.h0.q'\), which is not an edge"):
        Graph(s, r, torch.zeros(len(s), len(r)))
    good = torch.where(mask, 1.0, float("nan"))
    with pytest.raises(ValueError, match="in_circuit marks"):
        Graph(s, r, good, {}, torch.ones(len(s), len(r), dtype=torch.bool))
    with pytest.raises(ValueError, match="appears twice"):
        Graph(s + ["m1"], r, torch.full((len(s) + 1, len(r)), float("nan")))
    with pytest.raises(ValueError, match="floating point"):
        Graph(s, r, mask.long())
    assert Graph(s, r, good.double()).scores.dtype == torch.float32


def test_json_round_trip_is_exact(tmp_path):
    g = small_graph()
    g.scores[~torch.isnan(g.scores)] += torch.randn(46, generator=torch.Generator().manual_seed(0))
    g.scores[0, g.receivers.index("logits")] = float("nan")
    for graph in (g, g.top_k(7)):
        text = json.dumps(graph.to_json(), allow_nan=False)
        back = Graph.from_json(json.loads(text))
        path = tmp_path / "graph.json"
        graph.save_json(path)
        loaded = Graph.load_json(path)
        for other in (back, loaded):
            assert other.senders == graph.senders and other.receivers == graph.receivers
            assert other.metadata == graph.metadata
            assert torch.equal(torch.isnan(other.scores), torch.isnan(graph.scores))
            assert torch.equal(other.scores.nan_to_num(0.0), graph.scores.nan_to_num(0.0))
            assert (other.in_circuit is None) == (graph.in_circuit is None)
            if graph.in_circuit is not None:
                assert torch.equal(other.in_circuit, graph.in_circuit)
    data = g.to_json()
    assert data["nodes"] == ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1", "logits"]
    assert len(data["edges"]) == 46 and data["edges"][0]["sender"] == "input"


def test_json_refusals():
    g = small_graph()
    data = g.to_json()
    data["edges"].append(dict(data["edges"][0]))
    with pytest.raises(ValueError, match="listed twice"):
        Graph.from_json(data)
    data = g.to_json()
    data["edges"][0] = {"sender": "m1", "receiver": "a0.h0.q", "score": None}
    with pytest.raises(ValueError, match="is not an edge"):
        Graph.from_json(data)
    with pytest.raises(ValueError, match="not a glassbox graph"):
        Graph.from_json({"senders": []})
    g.scores[0, 0] = float("inf")
    with pytest.raises(ValueError, match="infinite"):
        g.to_json()
