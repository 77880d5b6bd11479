"""What a notebook shows for a cache, a patching result, a graph, an SAE and a model: a short repr and a
small offline HTML view (no script, no network), whose numbers and names are the object's own."""

import html
import json
import re

import pytest
import torch

from glassbox import HookedTransformer
from glassbox.interp.attribution import Graph
from glassbox.interp.attribution.edges import edge_mask_for, receivers, senders
from glassbox.interp.patching import LogitDiff, PatchResult, patch_resid_pre

CLEAN, CORRUPTED = "Elizabeth read the letter. Then Elizabeth read the", "Elizabeth read the garden. Then Elizabeth read the"


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


def offline(page: str) -> None:
    assert "<script" not in page.lower() and "http" not in page.lower(), page[:300]


def cells(page: str) -> list:
    """The text of each <td> of a page, unescaped."""
    return [html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", page)]


def test_cache_groups_its_keys_by_layer(model):
    _, cache = model.run_with_cache(CLEAN)
    page = cache._repr_html_()
    offline(page)
    rows = cells(page)
    by_group = {rows[i]: (int(rows[i + 1]), rows[i + 2], rows[i + 3]) for i in range(0, len(rows), 4)}
    keys = list(cache.keys())
    assert list(by_group) == ["model", "blocks.0", "blocks.1"]
    for layer in range(model.cfg.n_layers):
        mine = [k for k in keys if k.startswith(f"blocks.{layer}.")]
        count, names, size = by_group[f"blocks.{layer}"]
        assert count == len(mine) and all(f"{k[len(f'blocks.{layer}.'):]} {list(cache[k].shape)}" in names
                                          for k in mine)
        assert size == f"{sum(cache[k].numel() * 4 for k in mine) / 2**20:.2f} MiB"  # float32: 4 bytes
    outside = [k for k in keys if not k.startswith("blocks.")]
    assert by_group["model"][0] == len(outside) and "hook_embed" in by_group["model"][1]
    assert sum(c for c, _, _ in by_group.values()) == len(cache)
    text = repr(cache)
    assert text == (f"ActivationCache({len(cache)} activations: 2 layers, {len(outside)} outside the blocks; "
                    f"{cache.nbytes / 2**20:.2f} MiB)")


@pytest.fixture(scope="module")
def result(model):
    clean, corrupted = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    logits, cache = model.run_with_cache(clean)
    metric = LogitDiff(model.to_single_token(" letter"), model.to_single_token(" garden"))
    return patch_resid_pre(model, corrupted, cache, metric)


def test_patching_heatmap_holds_every_value_and_label(result):
    page = result._repr_html_()
    offline(page)
    n_layers, n_pos = result.shape
    titles = re.findall(r'<td[^>]*title="([^"]*)"', page)
    assert len(titles) == n_layers * n_pos
    for index, title in enumerate(titles):  # row-major: layer, then position
        i, j = divmod(index, n_pos)
        label, value = html.unescape(title).rsplit(": ", 1)
        assert label == f"{result.labels['layer'][i]} / {result.labels['pos'][j]}"
        assert float(value) == pytest.approx(float(result.values[i, j]), rel=1e-5, abs=1e-12)  # printed to 6 digits
    assert [float(c) for c in cells(page)] == pytest.approx(result.values.reshape(-1).tolist(), rel=5e-3, abs=1e-9)
    for token in result.labels["pos"]:
        assert f">{html.escape(token)}</th>" in page
    scale = float(result.values.abs().max())
    assert f"full at |value| = {scale:.3g}" in page
    assert "not shown" not in page


def test_heatmap_escapes_labels_colours_signs_and_says_what_it_leaves_out():
    values = torch.tensor([[1.0, -1.0, 0.0, float("nan")]])
    r = PatchResult(values, ("layer", "pos"), {"layer": ["0"], "pos": ["<b>", "&", "x", "y"]}, "t", "m")
    page = r._repr_html_()
    assert page.count("<b>") == 1 and "&lt;b&gt;" in page and "&amp;" in page  # <b> only round the title
    colours = re.findall(r"background:([^\"]*)\"", page)
    assert colours == ["rgb(255,0,0)", "rgb(0,0,255)", "rgb(255,255,255)", "#bbbbbb"]
    wide = PatchResult(torch.arange(70.0).reshape(1, 70), ("layer", "pos"))
    page = wide._repr_html_()
    assert len(re.findall(r"<td", page)) == 64 and "not shown: 6 of 70 pos columns" in page
    deep = PatchResult(torch.zeros(2, 3, 5), ("layer", "head", "pos"))
    page = deep._repr_html_()
    assert "select" in page and "2 x 3 x 5" in page and "<td" in page
    one = PatchResult(torch.tensor([0.5, -0.25]), ("layer",), {"layer": ["0", "1"]})
    assert cells(one._repr_html_()) == ["0.5", "-0.25"]


def small_graph() -> Graph:
    from glassbox import Config

    cfg = Config(d_model=8, n_layers=2, n_heads=2, d_vocab=11, n_ctx=7)
    s, r = senders(cfg), receivers(cfg)
    scores = torch.where(edge_mask_for(s, r), 0.0, float("nan"))
    for (a, b), value in {("m0", "logits"): -5.0, ("a0.h1", "a1.h0.k"): 3.0, ("input", "m1"): 2.0}.items():
        scores[s.index(a), r.index(b)] = value
    return Graph(s, r, scores, {"method": "hand"})


def test_graph_repr_counts_instead_of_dumping_the_scores():
    g = small_graph()
    text = repr(g)
    assert "tensor" not in text and len(text) < 300, text
    n_scored = int((~torch.isnan(g.scores)).sum())
    assert text == (f"Graph({len(g.senders)} senders, {len(g.receivers)} receivers, {g.n_edges} edges "
                    f"({n_scored} scored); top: m0->logits -5, input->m1 +2, a0.h1->a1.h0.k +3; method hand)"
                    .replace("input->m1 +2, a0.h1->a1.h0.k +3", "a0.h1->a1.h0.k +3, input->m1 +2"))
    circuit = g.top_k(2)
    text = repr(circuit)
    assert "circuit: 2 edges over 4 nodes" in text  # m0, logits, a0.h1, a1.h0
    page = circuit._repr_html_()
    offline(page)
    rows = cells(page)
    assert rows[:12] == ["senders", str(len(g.senders)), "receivers", str(len(g.receivers)), "edges", str(g.n_edges),
                         "scored", str(n_scored), "circuit edges", "2", "circuit nodes", "4"]
    edges = rows[12:12 + 5 * 10]
    assert edges[:10] == ["1", "m0", "logits", "-5", "yes", "2", "a0.h1", "a1.h0.k", "+3", "yes"]
    assert edges[10:15] == ["3", "input", "m1", "+2", "no"]
    assert rows[-1] == ", ".join(circuit.nodes_in_circuit())


def test_sae_shows_its_shape_and_saved_evals():
    from glassbox.interp.sae.format import SHIPPED_SAES_DIR, load_sae

    name = sorted(p.name for p in SHIPPED_SAES_DIR.iterdir() if (p / "cfg.json").is_file())[0]
    sae = load_sae(name)
    cfg = json.loads((SHIPPED_SAES_DIR / name / "cfg.json").read_text())
    evals = json.loads((SHIPPED_SAES_DIR / name / "evals.json").read_text())["evals"]
    text = repr(sae)
    assert "\n" not in text and f"d_in={cfg['d_in']}, d_sae={cfg['d_sae']}" in text and cfg["metadata"]["hook_name"] in text
    assert f"L0 {evals['l0']:.3g}, explained variance {evals['explained_variance']:.3g}" in text
    page = sae._repr_html_()
    offline(page)
    rows = dict(zip(cells(page)[::2], cells(page)[1::2]))
    assert rows["architecture"] == cfg["architecture"] and rows["hook"] == cfg["metadata"]["hook_name"]
    assert rows["d_sae"] == str(cfg["d_sae"]) and rows["dtype"] == "float32" and rows["device"] == "cpu"
    assert rows["eval explained_variance"] == f"{evals['explained_variance']:.4g}"


def test_sae_evals_of_a_train_sae_folder_and_damaged_ones(tmp_path):
    from glassbox.interp.reprs import saved_evals

    (tmp_path / "sae").mkdir()
    (tmp_path / "evals.json").write_text(json.dumps({"evals": {"l0": 3.0, "explained_variance": 0.5}}))
    assert saved_evals(tmp_path / "sae") == {"l0": 3.0, "explained_variance": 0.5}
    other = tmp_path / "other"
    other.mkdir()
    assert saved_evals(other) is None  # the parent's evals are another run's unless the folder is sae/
    for damaged in ("{", "[1]", json.dumps({"evals": {"l0": "many"}}), json.dumps({"evals": 3})):
        (other / "evals.json").write_text(damaged)
        assert saved_evals(other) is None


def test_model_view_names_sizes_and_the_hooks_on(model):
    page = model._repr_html_()
    offline(page)
    rows = dict(zip(cells(page)[::2], cells(page)[1::2]))
    assert rows["family"] == "gpt2" and rows["layers"] == "2" and rows["d_model"] == str(model.cfg.d_model)
    assert rows["parameters"] == f"{sum(p.numel() for p in model.parameters()):,}"
    assert rows["hooks attached"] == "none" and rows["hook flags on"] == "none"
    assert rows["hook points"] == str(len(model.hook_dict))
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", lambda z, hook: z)]):
        rows = dict(zip(cells(model._repr_html_())[::2], cells(model._repr_html_())[1::2]))
        assert rows["hooks attached"] == "1 hook points: blocks.1.attn.hook_z (1 fwd, 0 bwd)"
    assert not model.has_hooks
