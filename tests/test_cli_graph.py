"""``glassbox graph`` on the shipped model with a seeded transcoder set in circuit-tracer's layout."""

import json
import re

import pytest
import torch

from glassbox.cli import main
from glassbox.interp.graphs.export import load_graph
from glassbox.interp.transcoders import save_circuit_tracer, seeded_set

PROMPT = "Elizabeth read the letter. Then Elizabeth read the"


@pytest.fixture(scope="module")
def transcoders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tc") / "set"
    save_circuit_tracer(seeded_set(2, 192, 96, seed=3, input_hook="ln2.hook_normalized", bias=-1.0), folder)
    return folder


def test_graph_command_writes_files_page_and_paths(transcoders, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    assert main(["graph", "--transcoders", str(transcoders), "--prompt", PROMPT, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "top logit ' letter'" in text and "top paths into it" in text
    assert len(re.findall(r"^  \d\.\d{4}  .* -> logit ' letter'$", text, flags=re.M)) == 5
    graph = load_graph(out)
    assert graph.n_layers == 2 and graph.n_features > 50
    data = json.loads((out / "graph.json").read_text())
    assert {n["feature_type"] for n in data["nodes"]} >= {"embedding", "logit"}
    page = (out / "graph.html").read_text()
    # offline: no element loads anything (the only URL is the SVG namespace name, which is not fetched)
    assert not re.search(r"\b(src|href)\s*=", page) and "fetch(" not in page and "XMLHttpRequest" not in page
    assert set(re.findall(r"https?://[^\s'\"]+", page)) == {"http://www.w3.org/2000/svg"}
    embedded = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1)
    embedded = json.loads(embedded.replace("<\\/", "</"))
    assert embedded["nodes"] == data["nodes"]
    assert (out / "notes.md").read_text() == "mine"
    # every feature node has its details, found on the held-out text (not the training part)
    from glassbox.cli.demo import HELDOUT_FRAC
    from glassbox.train.data import split_text

    features = {n["node_id"].rsplit("_", 1)[0] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"}
    assert set(embedded["feature_details"]) == features and len(features) > 5
    assert embedded["feature_text"] == "held-out data/austen.txt, first 4096 tokens (whole windows)"
    heldout = split_text(open("data/austen.txt", encoding="utf-8").read(), HELDOUT_FRAC)[1]
    shown = ["".join(c["tokens"]) for d in embedded["feature_details"].values() for c in d["contexts"]]
    assert len(shown) > 20 and all(s.replace("<|endoftext|>", "") in heldout for s in shown)


def test_contexts_text_is_the_text_the_features_are_read_on(transcoders, tmp_path):
    """``--contexts-text``: the activations shown are the set's encoder on that text, by hand."""
    from glassbox.interp.transcoders import load_circuit_tracer
    from glassbox.models import HookedTransformer

    text = tmp_path / "mine.txt"
    text.write_text("Elizabeth walked to the window. Mr. Darcy read the letter twice, and then Elizabeth read it.")
    out = tmp_path / "o"
    assert main(["graph", "--transcoders", str(transcoders), "--prompt", PROMPT, "--out", str(out),
                 "--contexts-text", str(text)]) == 0
    page = (out / "graph.html").read_text()
    embedded = json.loads(re.search(r'id="data">(.*?)</script>', page, re.S).group(1).replace("<\\/", "</"))
    assert embedded["feature_text"] == "mine.txt, first 4096 tokens (whole windows)"
    model = HookedTransformer.from_pretrained("glassbox-austen")
    ts = load_circuit_tracer(transcoders)
    ids = [model.bos_token_id] + model.tokenizer.encode(text.read_text(), add_special_tokens=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
    checked = 0
    for key, d in embedded["feature_details"].items():
        layer, f = map(int, key.split("_"))
        x = cache[ts.feature_input_hook(layer)][0, 1:].double()  # BOS is not counted
        hand = torch.relu(x @ ts.W_enc(layer)[:, f].detach().double() + ts.b_enc(layer)[f].detach().double())
        assert abs(d["max_act"] - float(hand.max())) <= 2e-5  # float32 encode of d_model 192: measured 8.9e-7
        assert d["frequency"] == pytest.approx(float((hand > 0).double().mean()), abs=1e-12)
        checked += 1
    assert checked > 5


@pytest.mark.parametrize("extra,match", [
    (["--transcoders", "/nonexistent/tc"], "no such folder"),
    (["--transcoders", "glassbox-austen-plx"], "nor a set shipped.*glassbox-austen-plt"),
    (["--node-threshold", "1.5"], "not in \\[0, 1\\]"),
    (["--prompt", ""], None),
    (["--contexts-text", "/nonexistent/t.txt"], "--contexts-text '/nonexistent/t.txt': no such file"),
])
def test_mistakes_are_one_line_and_status_2(transcoders, tmp_path, capsys, extra, match):
    args = ["graph", "--transcoders", str(transcoders), "--prompt", PROMPT, "--out", str(tmp_path / "o"), *extra]
    if "1.5" in extra:  # argparse's own type check
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2
    else:
        assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassbox graph: error:") and err.count("\n") == 1
    if match:
        assert re.search(match, err)


def test_a_set_of_another_width_is_refused(tmp_path, capsys):
    folder = tmp_path / "wide"
    save_circuit_tracer(seeded_set(2, 64, 32, seed=1, input_hook="ln2.hook_normalized"), folder)
    assert main(["graph", "--transcoders", str(folder), "--prompt", PROMPT, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "d_model" in err


def test_a_shipped_set_by_name(tmp_path, capsys):
    """``--transcoders`` takes a shipped set's name; the graph it writes is the one of the loaded set."""
    from glassbox.interp.graphs import attribute
    from glassbox.interp.graphs.export import load_graph
    from glassbox.interp.transcoders import load_transcoders
    from glassbox.models import HookedTransformer

    out = tmp_path / "g"
    assert main(["graph", "--transcoders", "glassbox-austen-plt", "--prompt", PROMPT, "--out", str(out)]) == 0
    model = HookedTransformer.from_pretrained("glassbox-austen")
    tokens = model.to_tokens(PROMPT)[0]
    expected = attribute(model, load_transcoders("glassbox-austen-plt"), tokens, max_n_logits=10,
                         desired_logit_prob=0.95, batch_size=64)
    written = load_graph(out)
    assert torch.equal(written.adjacency, expected.adjacency)
