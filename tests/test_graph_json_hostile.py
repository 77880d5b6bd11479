"""Graph files that are damaged, hand-edited or for another model are refused, naming the file and the
first bad entry; files the previous glassbox wrote (format 1, committed in tests/data) still read.

Oracles: the committed files parsed by plain ``json`` (the scores and circuit flags the loader must give
back), the edge list written out from ``edge_exists`` by the test, and the exact text edits below, each of
which must be refused (not read as another graph).
"""

import json
import math
from pathlib import Path

import pytest
import torch

from glassbox.interp.attribution.edges import edge_exists, receivers, senders
from glassbox.interp.attribution.graph import Graph
from glassbox.models import Config, HookedTransformer

DATA = Path(__file__).parent / "data"
V1_CIRCUIT = DATA / "graph_v1_circuit.json"  # 2 layers x 2 heads with MLPs, a 6-edge circuit, one null score
V1_GQA = DATA / "graph_v1_gqa_attn_only.json"  # 2 layers, 4 query heads over 2 kv heads, attention-only
CFG = Config(d_model=14, n_layers=2, n_heads=2, d_vocab=11, n_ctx=7)


def v1(path=V1_CIRCUIT) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def write(tmp_path, data, name="graph.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def refused(tmp_path, data, *fragments, error=ValueError):
    """Loading ``data`` raises ``error`` whose message names the file and every fragment."""
    path = write(tmp_path, data)
    with pytest.raises(error) as info:
        Graph.load_json(path)
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# --- the files the previous glassbox wrote ----------------------------------------------------------
@pytest.mark.parametrize("path", [V1_CIRCUIT, V1_GQA], ids=["circuit", "gqa-attn-only"])
def test_previous_version_files_read_exactly(path):
    data = v1(path)
    graph = Graph.load_json(path)
    assert graph.senders == data["senders"] and graph.receivers == data["receivers"]
    assert graph.metadata == data["metadata"]
    listed = {(e["sender"], e["receiver"]): e for e in data["edges"]}
    by_hand = {(s, r) for s in data["senders"] for r in data["receivers"] if edge_exists(s, r)}
    assert set(listed) == by_hand  # the old writer listed every edge
    for (s, r), edge in listed.items():
        got = graph.score(s, r)
        if edge["score"] is None:
            assert math.isnan(got)
        else:
            assert got == edge["score"]  # float32 values written in full: exact
        if data["has_circuit"]:
            assert bool(graph.in_circuit[graph.senders.index(s), graph.receivers.index(r)]) is edge["in_circuit"]
    assert (graph.in_circuit is None) == (not data["has_circuit"])
    if data["has_circuit"]:
        assert int(graph.in_circuit.sum()) == sum(e["in_circuit"] for e in data["edges"]) == 6


def test_round_trip_through_a_file_is_exact(tmp_path):
    graph = Graph.load_json(V1_CIRCUIT)
    path = tmp_path / "again.json"
    graph.save_json(path)
    assert json.loads(path.read_text(encoding="utf-8")) == v1()


# --- edges: every one present once, types exact ------------------------------------------------------
def test_missing_edge_refused_not_nan(tmp_path):
    data = v1()
    gone = data["edges"].pop(5)
    refused(tmp_path, data, "missing", f"{gone['sender']!r} -> {gone['receiver']!r}", "45 of the 46")


def test_duplicated_edge_refused(tmp_path):
    data = v1()
    data["edges"].append(dict(data["edges"][3]))
    refused(tmp_path, data, "edges[46]", "listed twice", "edges[3]")


@pytest.mark.parametrize("value, kind", [("false", "str"), (0, "int"), (None, "null"), (1.0, "float")])
def test_in_circuit_must_be_a_json_bool(tmp_path, value, kind):
    data = v1()
    data["edges"][7]["in_circuit"] = value
    edge = data["edges"][7]
    refused(tmp_path, data, f"edges[7] ({edge['sender']!r} -> {edge['receiver']!r})", "in_circuit", kind)


def test_missing_in_circuit_refused_when_the_file_has_a_circuit(tmp_path):
    data = v1()
    del data["edges"][2]["in_circuit"]
    refused(tmp_path, data, "edges[2]", "in_circuit", "has_circuit")


def test_in_circuit_refused_when_the_file_has_no_circuit(tmp_path):
    data = v1()
    data["has_circuit"] = False
    refused(tmp_path, data, "edges[0]", "in_circuit", "has_circuit is false")


@pytest.mark.parametrize("value, kind", [(True, "bool"), ("0.5", "str"), ([0.5], "list"), ({"v": 1}, "dict")])
def test_score_must_be_a_number_or_null(tmp_path, value, kind):
    data = v1()
    data["edges"][4]["score"] = value
    refused(tmp_path, data, "edges[4]", "score", kind)


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity"])
def test_non_finite_scores_refused(tmp_path, literal):
    data = v1()
    first = data["edges"][9]["score"]
    text = json.dumps(data).replace(json.dumps(first), literal, 1)
    assert text != json.dumps(data)
    edge = data["edges"][9]
    refused(tmp_path, text, f"edges[9] ({edge['sender']!r} -> {edge['receiver']!r})", literal)


@pytest.mark.parametrize("literal", ["NaN", "1e400"])
def test_non_finite_numbers_elsewhere_refused_by_place(tmp_path, literal):
    data = v1()
    data["metadata"]["metric_clean"] = 12345.5
    refused(tmp_path, json.dumps(data).replace("12345.5", literal), "metadata.metric_clean", literal)
    refused(tmp_path, json.dumps(v1()).replace('"version": 1', f'"version": {literal}'), "version", literal)


def test_score_beyond_float32_refused(tmp_path):
    data = v1()
    data["edges"][9]["score"] = 1e39  # finite in JSON and float64, inf in float32
    refused(tmp_path, data, "edges[9]", "float32")


def test_huge_integer_score_refused(tmp_path):
    data = v1()
    text = json.dumps(data).replace(json.dumps(data["edges"][9]["score"]), "1" + "0" * 400, 1)
    refused(tmp_path, text, "edges[9]", "float32")


def test_integer_score_reads_as_its_value(tmp_path):
    data = v1()
    data["edges"][9]["score"] = -3
    graph = Graph.load_json(write(tmp_path, data))
    assert graph.score(data["edges"][9]["sender"], data["edges"][9]["receiver"]) == -3.0


@pytest.mark.parametrize("key", ["weight", "Score"])
def test_unknown_edge_key_refused(tmp_path, key):
    data = v1()
    data["edges"][1][key] = 1.0
    refused(tmp_path, data, "edges[1]", repr(key))


def test_missing_score_key_refused(tmp_path):
    data = v1()
    del data["edges"][1]["score"]
    refused(tmp_path, data, "edges[1]", "'score'")


def test_duplicate_json_key_refused(tmp_path):
    text = json.dumps(v1()).replace('"score": ', '"score": 0.0, "score": ', 1)
    refused(tmp_path, text, "'score'", "twice")


@pytest.mark.parametrize("sender, receiver, named", [("a2.h0", "logits", "a2.h0"), ("a0.h5", "logits", "a0.h5"),
                                                     ("m0", "a0.h0.q", "not an edge"), ("input", "a0.kv0.k", "a0.kv0.k"),
                                                     ("a0.h0", "nowhere", "nowhere"), (3, "m0", "int"),
                                                     (["input"], "m0", "list")])
def test_edge_naming_nodes_the_graph_lacks_or_no_edge(tmp_path, sender, receiver, named):
    data = v1()
    data["edges"][0].update(sender=sender, receiver=receiver)
    refused(tmp_path, data, "edges[0]", named)


def test_edge_entry_not_an_object_refused(tmp_path):
    data = v1()
    data["edges"][3] = ["input", "m0", 0.5]
    refused(tmp_path, data, "edges[3]", "list")


# --- the top level -------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["format", "version", "senders", "receivers", "nodes", "edges", "has_circuit",
                                 "metadata"])
def test_missing_top_level_key_refused(tmp_path, key):
    data = v1()
    del data[key]
    refused(tmp_path, data, repr(key))


def test_unknown_top_level_key_refused(tmp_path):
    data = v1()
    data["scores"] = []
    refused(tmp_path, data, "'scores'", "unknown")


@pytest.mark.parametrize("version", [2, 0, "1", True, 1.0, None])
def test_version_must_be_the_int_1(tmp_path, version):
    data = v1()
    data["version"] = version
    refused(tmp_path, data, "version", repr(version))


@pytest.mark.parametrize("value", ["false", 1, None])
def test_has_circuit_must_be_a_json_bool(tmp_path, value):
    data = v1()
    data["has_circuit"] = value
    refused(tmp_path, data, "has_circuit", repr(value))


def test_wrong_format_and_non_object_refused(tmp_path):
    data = v1()
    data["format"] = "eap.graph"
    refused(tmp_path, data, "not a glassbox graph", "'eap.graph'")
    refused(tmp_path, [v1()], "not a glassbox graph", "list")


@pytest.mark.parametrize("value", ["input a0.h0", ["input", 3], {"input": 0}])
def test_senders_must_be_a_list_of_names(tmp_path, value):
    data = v1()
    data["senders"] = value
    refused(tmp_path, data, "senders")


def test_metadata_must_be_an_object(tmp_path):
    data = v1()
    data["metadata"] = [["method", "EAP"]]
    refused(tmp_path, data, "metadata", "list")


# --- the names: one model's complete lists, consistent with the metadata and the model ---------------
def test_sender_removed_with_its_edges_refused(tmp_path):
    data = v1()
    data["senders"].remove("a1.h1")
    data["edges"] = [e for e in data["edges"] if e["sender"] != "a1.h1"]
    data["nodes"].remove("a1.h1")
    refused(tmp_path, data, "senders", "'a1.h1'")


def test_receivers_reordered_refused(tmp_path):
    data = v1()
    r = data["receivers"]
    r[0], r[1] = r[1], r[0]
    refused(tmp_path, data, "receivers[0]", "'a0.h1.q'", "'a0.h0.q'")


def test_nodes_tampered_refused(tmp_path):
    data = v1()
    data["nodes"] = data["nodes"][:-1]
    refused(tmp_path, data, "nodes", "'logits'")


@pytest.mark.parametrize("field, value", [("n_layers", 3), ("n_heads", 4), ("attn_only", True)])
def test_metadata_config_disagreeing_with_the_names_refused(tmp_path, field, value):
    data = v1()
    data["metadata"]["cfg"][field] = value
    refused(tmp_path, data, f"metadata.cfg.{field}", repr(value))


def test_grouped_kv_count_checked_against_metadata(tmp_path):
    data = v1(V1_GQA)
    data["metadata"]["cfg"]["n_key_value_heads"] = 4
    refused(tmp_path, data, "n_key_value_heads", "2")


def test_load_for_a_model_of_another_shape_refused(tmp_path):
    path = write(tmp_path, v1())
    assert Graph.load_json(path, model=HookedTransformer(CFG)).senders == senders(CFG)
    assert Graph.load_json(path, model=CFG).receivers == receivers(CFG)
    for other, field in ((Config(d_model=14, n_layers=3, n_heads=2, d_vocab=11, n_ctx=7), "n_layers"),
                         (Config(d_model=12, n_layers=2, n_heads=3, d_vocab=11, n_ctx=7), "n_heads"),
                         (Config(d_model=14, n_layers=2, n_heads=2, d_vocab=11, n_ctx=7, attn_only=True), "attn_only")):
        with pytest.raises(ValueError) as info:
            Graph.load_json(path, model=other)
        assert str(path) in str(info.value) and field in str(info.value), str(info.value)


def test_writing_a_graph_no_model_has_is_refused(tmp_path):
    s, r = senders(CFG)[:-1], receivers(CFG)  # m1 dropped: not the senders of any model
    scores = torch.full((len(s), len(r)), float("nan"))
    graph = Graph(s, r, scores)
    with pytest.raises(ValueError, match="'m1'"):
        graph.save_json(tmp_path / "g.json")
    assert not (tmp_path / "g.json").exists()


# --- the file itself ----------------------------------------------------------------------------
def test_truncated_file_refused_with_its_name_and_place(tmp_path):
    text = json.dumps(v1())
    message = refused(tmp_path, text[: len(text) // 2], "not valid JSON", "line 1")
    assert "JSONDecodeError" not in type(message).__name__


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_file_refused(tmp_path, text):
    refused(tmp_path, text, "empty")


def test_not_utf8_refused(tmp_path):
    path = tmp_path / "graph.json"
    path.write_bytes(json.dumps(v1()).encode("utf-8").replace(b"glassbox.graph", b"glassbox\xff.graph"))
    with pytest.raises(ValueError) as info:
        Graph.load_json(path)
    assert str(path) in str(info.value) and "UTF-8" in str(info.value)


def test_utf8_bom_reads(tmp_path):
    path = tmp_path / "graph.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(v1()).encode("utf-8"))
    assert Graph.load_json(path).metadata == v1()["metadata"]


def test_folder_and_missing_path_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        Graph.load_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothere.json"):
        Graph.load_json(tmp_path / "nothere.json")


def test_from_json_names_its_source_generically():
    data = v1()
    data["edges"][0]["score"] = "x"
    with pytest.raises(ValueError, match=r"graph JSON: edges\[0\]"):
        Graph.from_json(data)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_from_json_refuses_python_non_finite_values(value):
    data = v1()
    data["edges"][0]["score"] = value
    with pytest.raises(ValueError, match=r"edges\[0\].*not a finite number"):
        Graph.from_json(data)
    data = v1()
    data["metadata"]["x"] = value
    with pytest.raises(ValueError, match="metadata.x"):
        Graph.from_json(data)


# --- writing: through the crash-safe writer ----------------------------------------------------------
def test_save_json_faulted_at_any_call_leaves_the_old_or_the_new_file(tmp_path):
    from fs_faults import fail_at

    old, new = Graph.load_json(V1_CIRCUIT), Graph.load_json(V1_GQA)
    event, seen = 1, set()
    while True:
        path = tmp_path / str(event) / "graph.json"
        path.parent.mkdir()
        old.save_json(path)
        (path.parent / "notes.txt").write_text("mine")
        faulted, error = fail_at(event, lambda: new.save_json(path))
        if not faulted:
            assert error is None
            break
        assert isinstance(error, OSError) and str(path.name) in str(error), f"event {event}: {error!r}"
        back = Graph.load_json(path)  # whole: the old graph or the new one, never a torn file
        assert back.senders in (old.senders, new.senders), f"event {event}"
        seen.add(back.senders == new.senders)
        assert (path.parent / "notes.txt").read_text() == "mine"
        assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".glassbox-tmp-")) == \
            ["graph.json", "notes.txt"]
        event += 1
    assert event > 3 and False in seen, (event, seen)
    assert Graph.load_json(path).senders == new.senders


def test_save_json_refusals_leave_the_old_file(tmp_path):
    path = tmp_path / "graph.json"
    Graph.load_json(V1_CIRCUIT).save_json(path)
    before = path.read_bytes()
    bad = Graph.load_json(V1_GQA)
    bad.metadata["tensor"] = torch.zeros(2)  # not JSON
    with pytest.raises(TypeError):
        bad.save_json(path)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        Graph.load_json(V1_CIRCUIT).save_json(tmp_path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["graph.json"]


def test_save_json_on_a_full_disk_keeps_the_old_file(tmp_path):
    """RLIMIT_FSIZE (writes past 3000 bytes fail with EFBIG, as a full disk fails with ENOSPC): the old
    graph stays whole, and the error is an OSError naming the file."""
    import subprocess
    import sys

    path = tmp_path / "graph.json"
    Graph.load_json(V1_CIRCUIT).save_json(path)
    before = path.read_bytes()
    assert len(before) > 3000 and V1_GQA.stat().st_size > 3000
    script = f"""
import resource, signal, sys
from glassbox.interp.attribution.graph import Graph
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
graph = Graph.load_json({str(V1_GQA)!r})
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
try:
    graph.save_json({str(path)!r})
except OSError as error:
    print("OSError", error.errno, error)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("OSError 27") and "graph.json" in run.stdout, run.stdout  # EFBIG
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["graph.json"]


def test_writing_refuses_what_reading_would_refuse(tmp_path):
    """Metadata whose cfg disagrees with the names, or holding NaN: refused on writing, naming the key,
    so that no file is written that the reader then refuses."""
    graph = Graph.load_json(V1_CIRCUIT)
    graph.metadata["cfg"]["n_heads"] = 3
    with pytest.raises(ValueError, match=r"metadata\.cfg\.n_heads is 3"):
        graph.save_json(tmp_path / "a.json")
    graph = Graph.load_json(V1_CIRCUIT)
    graph.metadata["faithfulness_by_size"] = {"3": float("nan")}
    with pytest.raises(ValueError, match=r"metadata\.faithfulness_by_size\.3"):
        graph.save_json(tmp_path / "b.json")
    assert list(tmp_path.iterdir()) == []
