"""Graph files: glassbox's own (round trip, strict reader) and circuit-tracer's viewer JSON (unique ids)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from glassbox.interp.graphs import attribute
from glassbox.interp.graphs.export import META, TENSORS, frontend_json, load_graph, save_graph
from glassbox.interp.graphs.prune import prune_graph
from tests.graph_models import family_model, family_transcoders
from tests.test_graph_identities import prompt_tokens


@pytest.fixture(scope="module")
def graph():
    model, _ = family_model("gpt2")
    # d_transcoder 53 > n_pos: feature ids 3..12 of layer 0 meet error layers/positions, the collision case
    return attribute(model, family_transcoders("gpt2", d_transcoder=53), prompt_tokens("random", 1, 53))


def test_round_trip_keeps_every_tensor_and_the_users_files(graph, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    save_graph(graph, tmp_path)
    back = load_graph(tmp_path)
    for name in ("tokens", "active_features", "activation_values", "logit_tokens", "logit_probabilities",
                 "adjacency", "values"):
        assert torch.equal(getattr(back, name), getattr(graph, name)), name
    assert back.n_layers == graph.n_layers and back.exclude_positions == graph.exclude_positions
    assert (tmp_path / "notes.txt").read_text() == "mine"


def damage(tmp_path, graph, key, value):
    save_graph(graph, tmp_path)
    t = load_file(str(tmp_path / TENSORS))
    if value is None:
        del t[key]
    else:
        t[key] = value.contiguous()
    save_file(t, str(tmp_path / TENSORS))


@pytest.mark.parametrize("key,make,match", [
    ("adjacency", None, "'adjacency' is missing"),
    ("adjacency", lambda g: g.adjacency[:-1], "'adjacency' has shape"),
    ("values", lambda g: g.values.double(), None),  # float64 is a valid storage dtype: loads
    ("tokens", lambda g: g.tokens.int(), "'tokens' has dtype"),
    ("activation_values", lambda g: g.activation_values.index_fill(0, torch.tensor([0]), float("nan")), "NaN"),
    ("active_features", lambda g: g.active_features.flip(0).contiguous(), "sorted"),
    ("active_features", lambda g: g.active_features.index_fill(1, torch.tensor([1]), 0), "outside"),
    ("adjacency", lambda g: g.adjacency.index_put((torch.tensor([0]), torch.tensor([g.n_features - 1])),
                                                  torch.tensor(1.0)), "later layer or position"),
    ("adjacency", lambda g: g.adjacency.index_put((torch.tensor([g.token_start]), torch.tensor([0])),
                                                  torch.tensor(1.0)), "into an error or token"),
    ("extra", lambda g: torch.zeros(1), "'extra' is not part"),
])
def test_damaged_tensors_are_refused_by_name(graph, tmp_path, key, make, match):
    damage(tmp_path, graph, key, None if make is None else make(graph))
    if match is None:
        load_graph(tmp_path)
        return
    with pytest.raises(ValueError, match=match) as e:
        load_graph(tmp_path)
    assert TENSORS in str(e.value)


@pytest.mark.parametrize("edit,match", [
    (lambda m: m.update(format="other"), "'format'"), (lambda m: m.update(version="1"), "'version'"),
    (lambda m: m.update(n_layers=2.0), "'n_layers'"), (lambda m: m.update(exclude_positions=-1), "'exclude_positions'"),
    (lambda m: m.update(n_layers=4), "'adjacency' has shape"), (lambda m: m.update(meta=[]), "'meta'"),
])
def test_hand_edited_json_is_refused_by_name(graph, tmp_path, edit, match):
    save_graph(graph, tmp_path)
    meta = json.loads((tmp_path / META).read_text())
    edit(meta)
    (tmp_path / META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=match):
        load_graph(tmp_path)
    (tmp_path / META).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_graph(tmp_path)
    (tmp_path / TENSORS).write_bytes(b"truncated")
    (tmp_path / META).unlink()
    with pytest.raises(FileNotFoundError, match=META):
        load_graph(tmp_path)


def test_frontend_json_has_unique_ids_and_circuit_tracers_fields(graph, tmp_path):
    # keep everything: every node is written, so every possible collision is present
    keep_all = prune_graph(graph, 1.0, 1.0)
    toks = [f"t{i}" for i in range(graph.n_pos)]
    data = frontend_json(graph, keep_all, slug="g", prompt="p", token_strings=toks,
                         logit_strings=[f"l{i}" for i in range(graph.n_logits)])
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    # the collision circuit-tracer's ids have: feature f of layer 0 at pos p vs the error of layer f at pos p
    feats = {(l, f, p) for l, p, f in graph.active_features.tolist()}
    clash = [(f, p) for (l, f, p) in feats if l == 0 and f < graph.n_layers]
    assert clash, "the fixture must contain a layer-0 feature whose id circuit-tracer would give an error node"
    f, p = clash[0]
    assert f"0_{f}_{p}" in ids and f"err_{f}_{p}" in ids
    js = [n["jsNodeId"] for n in data["nodes"] if n["feature_type"] != "cross layer transcoder"]
    assert len(js) == len(set(js))
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert kinds == {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}
    node_ids = set(ids)
    assert all(link["source"] in node_ids and link["target"] in node_ids for link in data["links"])
    m = keep_all.node_mask
    kept = (graph.adjacency != 0) & keep_all.edge_mask & m[:, None] & m[None, :]
    assert len(data["links"]) == int(kept.sum()) > 0.5 * int((graph.adjacency != 0).sum())
    for n in data["nodes"]:
        assert set(n) == {"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob", "is_target_logit",
                          "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp", "influence", "activation"}
    (tmp_path / "mine.txt").write_text("x")
    save_graph(graph, tmp_path, frontend=data)
    assert json.loads((tmp_path / "g.json").read_text()) == json.loads(json.dumps(data))
    assert json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"][0]["slug"] == "g"
    assert (tmp_path / "mine.txt").read_text() == "x"
    for slug in ("../x", "", ".hidden"):
        with pytest.raises(ValueError, match="slug"):
            save_graph(graph, tmp_path, frontend={**data, "metadata": {**data["metadata"], "slug": slug}})
    assert (tmp_path / "g.json").is_file()  # a refused save leaves the folder as it was
    save_graph(graph, tmp_path)  # a later save without the viewer files removes glassbox's old ones only
    assert not (tmp_path / "g.json").exists() and (tmp_path / "mine.txt").read_text() == "x"
