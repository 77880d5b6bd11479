"""``glassbox circuit`` end to end on the shipped model, and its argument errors.

The end-to-end runs check what the command wrote against independent computations: the circuit in
graph.json is the top k edges of its own scores by |score| (sorted here in Python), the scores are
``eap``'s for the method asked, and the faithfulness printed for the chosen circuit is recomputed
with the hook-by-hook circuit oracle (tests/circuit_oracle.py) and plain clean and corrupted
forwards. Errors: one line on stderr naming the argument, exit 2, no traceback.
"""

import re
import shutil
from pathlib import Path

import pytest
import torch

from circuit_oracle import oracle, plain
from glassbox import HookedTransformer
from glassbox.cli import main
from glassbox.cli.circuit import TARGET, sweep_sizes
from glassbox.interp.attribution.eap import eap
from glassbox.interp.attribution.graph import Graph
from glassbox.interp.patching import LogitDiff

CLEAN = "Elizabeth read the letter. Then Elizabeth read the"
CORRUPTED = "Elizabeth read the garden. Then Elizabeth read the"
STORY = ["--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", " letter", "--distractor", " garden"]
SHIPPED = Path(__file__).resolve().parent.parent / "glassbox" / "assets" / "models" / "glassbox-austen"


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("glassbox-austen")


def run_cli(capsys, *args) -> tuple:
    """(exit code, stdout, stderr) of ``glassbox circuit ARGS``, argparse's exit included."""
    try:
        code = main(["circuit", *map(str, args)])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(capsys, args, *fragments) -> str:
    code, out, err = run_cli(capsys, *args)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassbox circuit: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert code == 2, (code, lines[0])
    return lines[0]


def printed_faithfulness(out: str) -> dict:
    """{k: faithfulness} from the table, and the k marked chosen."""
    rows = re.findall(r"^\s+([\d,]+)\s+(-?\d+\.\d{4})(  <- chosen)?$", out, re.M)
    table = {int(k.replace(",", "")): float(f) for k, f, _ in rows}
    chosen = [int(k.replace(",", "")) for k, _, mark in rows if mark]
    assert len(chosen) == 1, out
    return table, chosen[0]


def ranked_top(graph: Graph, k: int) -> set:
    pairs = [(abs(graph.scores[i, j].item()), -i, -j, s, r) for i, s in enumerate(graph.senders)
             for j, r in enumerate(graph.receivers) if not torch.isnan(graph.scores[i, j])]
    return {(s, r) for *_, s, r in sorted(pairs, reverse=True)[:k]}


def circuit_of(graph: Graph) -> set:
    return {(graph.senders[i], graph.receivers[j]) for i, j in graph.in_circuit.nonzero().tolist()}


# --- end to end --------------------------------------------------------------------------------------

def test_eap_ig_end_to_end_on_the_shipped_model(model, tmp_path, capsys):
    out_dir = tmp_path / "circ"
    code, out, err = run_cli(capsys, *STORY, "--steps", 2, "--out", out_dir)
    assert code == 0, err
    assert "evaluating circuits" in err and "EAP-IG-inputs" in err, "progress bars on by default"
    graph = Graph.load_json(out_dir / "graph.json")
    meta = graph.metadata
    assert meta["method"] == "EAP-IG-inputs" and meta["steps"] == 2
    assert (meta["clean"], meta["corrupted"], meta["answer"], meta["distractor"]) == (CLEAN, CORRUPTED, " letter",
                                                                                      " garden")

    # The scores are eap's for this method and step count (bit for bit: the same computation).
    clean, corrupted = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    metric = LogitDiff(model.to_single_token(" letter"), model.to_single_token(" garden"))
    direct = eap(model, clean, corrupted, metric, method="EAP-IG-inputs", steps=2)
    assert torch.equal(graph.scores.isnan(), direct.scores.isnan())
    assert torch.equal(graph.scores.nan_to_num(), direct.scores.nan_to_num())

    # The table: every swept size, the chosen one the smallest reaching the target.
    table, chosen = printed_faithfulness(out)
    assert sorted(table) == sweep_sizes(graph.n_edges)
    assert chosen == min(k for k, f in table.items() if f >= TARGET)
    assert meta["circuit_size"] == chosen and int(graph.in_circuit.sum()) == chosen
    assert circuit_of(graph) == ranked_top(graph, chosen)

    # Faithfulness of the chosen circuit and of a small one, by the hook-by-hook oracle.
    full, empty = plain(model, clean, metric).item(), plain(model, corrupted, metric).item()
    for k in (chosen, 5):
        mask = graph.top_k(k).in_circuit
        by_oracle = (oracle(model, clean, corrupted, metric, mask).item() - empty) / (full - empty)
        # saved: measured 1.9e-6 over every size (logit differences up to 7.8), bound 2e-5: 10x
        assert abs(meta["faithfulness_by_size"]["faithfulness"][sorted(table).index(k)] - by_oracle) < 2e-5, k
        # printed to 4 decimals: rounding 5e-5 + 1.9e-6 measured, bound 5e-4: 10x
        assert abs(table[k] - by_oracle) < 5e-4, (k, table[k], by_oracle)
    assert re.search(r"clean 7\.\d{4}, corrupted -1\.\d{4}", out), out  # the story's logit differences
    assert f"clean {full:.4f}, corrupted {empty:.4f}" in out

    # CPR and CMD over MIB's fractions, printed and saved.
    mib = meta["faithfulness_mib"]
    assert mib["fractions"] == [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    assert f"CPR {meta['CPR']:.4f}" in out and f"CMD {meta['CMD']:.4f}" in out

    # The page: offline, the circuit's edges drawn, the caption naming the method and faithfulness.
    page = (out_dir / "circuit.html").read_text(encoding="utf-8")
    assert "<script src" not in page and "<link" not in page
    caption = page.split('id="caption">', 1)[1].split("</p>", 1)[0]
    assert "EAP-IG-inputs (2 steps)" in caption and f"{chosen} in the circuit" in caption
    assert f"faithfulness {table[chosen]:.3f}" in caption
    assert out.strip().splitlines()[-1].startswith(f"wrote {out_dir}/graph.json and {out_dir}/circuit.html")


def test_eap_with_top_k_and_no_progress(model, tmp_path, capsys):
    code, out, err = run_cli(capsys, *STORY, "--method", "EAP", "--top-k", 4, "--no-progress", "--out", tmp_path)
    assert code == 0, err
    assert err == "", "no progress bars"
    graph = Graph.load_json(tmp_path / "graph.json")
    assert graph.metadata["method"] == "EAP" and graph.metadata["circuit_size"] == 4
    assert circuit_of(graph) == ranked_top(graph, 4)
    table, chosen = printed_faithfulness(out)
    assert chosen == 4 and 4 in table and "(--top-k 4)" in out
    top = graph.edges()[:10]  # the printed top edges, in order
    printed = re.findall(r"^  (\S+) -> (\S+)\s+([+-]\d+\.\d{4})$", out, re.M)
    assert [(s, r) for s, r, _ in printed] == [(s, r) for s, r, _ in top]
    # printed to 4 decimals: |printed - score| is at most the half-unit 5e-5 (plus ~1e-12 from printing a float32)
    assert all(abs(float(v) - score) <= 5.0001e-5 for (_, _, v), (_, _, score) in zip(printed, top))


# --- argument errors ---------------------------------------------------------------------------------

def test_answer_and_distractor_must_be_one_token_each_and_differ(capsys, tmp_path):
    out = ["--out", tmp_path]
    base = ["--clean", CLEAN, "--corrupted", CORRUPTED]
    assert_user_error(capsys, base + ["--answer", " letterbox xyzzy", "--distractor", " garden"] + out,
                      "--answer ' letterbox xyzzy' is ", "tokens", "single-token")
    assert_user_error(capsys, base + ["--answer", " letter", "--distractor", " qqqzzz"] + out,
                      "--distractor ' qqqzzz' is ", "tokens")
    assert_user_error(capsys, base + ["--answer", " letter", "--distractor", " letter"] + out,
                      "--distractor ' letter' is the same token as --answer")


def test_clean_and_corrupted_must_have_equal_token_counts_and_differ(capsys, tmp_path, model):
    longer = "Elizabeth read the long letter. Then Elizabeth read the"
    n_clean, n_long = model.to_tokens(CLEAN).shape[1], model.to_tokens(longer).shape[1]
    assert n_clean != n_long
    answers = ["--answer", " letter", "--distractor", " garden", "--out", tmp_path]
    assert_user_error(capsys, ["--clean", CLEAN, "--corrupted", longer] + answers,
                      f"--clean is {n_clean} tokens and --corrupted {n_long}", "same number of tokens")
    assert_user_error(capsys, ["--clean", CLEAN, "--corrupted", CLEAN] + answers,
                      "--corrupted has the same tokens as --clean")
    assert_user_error(capsys, ["--clean", "", "--corrupted", CLEAN] + answers, "--clean is empty")
    assert_user_error(capsys, ["--clean", CLEAN, "--corrupted", "word " * 300] + answers,
                      "--corrupted is", "n_ctx")


def test_option_values_are_checked(capsys, tmp_path):
    out = ["--out", tmp_path]
    assert_user_error(capsys, STORY + ["--method", "EAP", "--steps", 4] + out, "--steps 4 is for EAP-IG")
    assert_user_error(capsys, STORY + ["--top-k", 76] + out, "--top-k 76 is more than this model's 75 edges")
    assert_user_error(capsys, STORY + ["--top-k", 0] + out, "--top-k", "whole number >= 1")
    assert_user_error(capsys, STORY + ["--method", "ACDC"] + out, "--method", "invalid choice", "EAP-IG")
    assert_user_error(capsys, STORY + ["--dtype", "int8"] + out, "--dtype", "invalid choice")
    assert_user_error(capsys, STORY + ["--model", "nosuch"] + out, "--model 'nosuch' is not a known model")
    (tmp_path / "file").write_text("x")
    assert_user_error(capsys, STORY + ["--out", tmp_path / "file"], "--out", "is an existing file")
    (tmp_path / "taken" / "graph.json").mkdir(parents=True)
    assert_user_error(capsys, STORY + ["--out", tmp_path / "taken"], "holds a folder named graph.json")
    assert not list((tmp_path / "taken").glob("*.html")), "nothing written before the error"


def test_a_parallel_block_model_is_refused_naming_the_option(capsys, tmp_path, model):
    """A GPT-J-style folder (attention and MLP reading one stream) with the shipped tokenizer."""
    from glassbox.models import Config

    cfg = Config(d_model=16, n_layers=1, n_heads=2, d_vocab=model.cfg.d_vocab, n_ctx=23, parallel_attn_mlp=True,
                 positional="rotary", rotary_style="interleaved", rotary_dim=4, unembed_bias=True, tied_unembed=False)
    folder = tmp_path / "parallel"
    torch.manual_seed(0)
    HookedTransformer(cfg).save_pretrained(folder)
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED / name, folder / name)
    capsys.readouterr()  # save_pretrained's progress bar
    line = assert_user_error(capsys, STORY + ["--model", folder, "--out", tmp_path / "o"], f"--model '{folder}'",
                             "parallel_attn_mlp")
    assert not (tmp_path / "o").exists(), line


def test_points_chooses_the_eap_ig_grid_and_is_refused_for_eap(model, tmp_path, capsys):
    from glassbox.cli import circuit
    from glassbox.interp.attribution.eap import POINTS, eap
    from glassbox.interp.patching import LogitDiff

    assert circuit.POINTS == POINTS
    code, out, err = run_cli(capsys, *STORY, "--steps", 2, "--points", "eap-ig-code", "--top-k", 3, "--no-progress",
                             "--out", tmp_path / "code")
    assert code == 0, err
    graph = Graph.load_json(tmp_path / "code" / "graph.json")
    assert graph.metadata["points"] == "eap-ig-code" and "eap-ig-code grid" in out
    clean, corrupted = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    metric = LogitDiff(model.to_single_token(" letter"), model.to_single_token(" garden"))
    ref = eap(model, clean, corrupted, metric, method="EAP-IG-inputs", steps=2, points="eap-ig-code")
    assert torch.equal(graph.scores.nan_to_num(), ref.scores.nan_to_num())  # the same call: bit-identical
    assert_user_error(capsys, STORY + ["--method", "EAP", "--points", "midpoint", "--out", tmp_path / "e"],
                      "--points midpoint is for EAP-IG")
    assert_user_error(capsys, STORY + ["--points", "endpoint", "--out", tmp_path / "e"], "--points", "invalid choice")


# --- the answer's spelling, and many pairs ----------------------------------------------------------

def test_an_answer_the_clean_run_does_not_prefer_is_warned_with_the_spaced_spelling(model, tmp_path, capsys):
    """``--answer letter`` (no leading space) is one token, but the clean run does not prefer it: the command
    runs, and says so on stderr with the value computed here and the spelling that is one token."""
    code, out, err = run_cli(capsys, "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", "letter", "--distractor",
                             " garden", "--method", "EAP", "--no-progress", "--out", tmp_path)
    assert code == 0, err
    metric = LogitDiff(model.tokenizer.encode("letter", add_special_tokens=False)[0], model.to_single_token(" garden"))
    clean_value = plain(model, model.to_tokens(CLEAN), metric).item()
    assert clean_value <= 0, clean_value  # measured -0.0286
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassbox circuit: warning: "), err
    assert f"is {clean_value:.4g} on the clean run" in lines[0] and "did you mean --answer ' letter'" in lines[0], lines


def test_a_word_that_is_one_token_only_with_a_space_is_refused_with_that_spelling(model, capsys, tmp_path):
    from glassbox.interp.report import single_token_words

    spaced_only = next(w for w in single_token_words(model)
                       if len(model.tokenizer.encode(w[1:], add_special_tokens=False)) > 1)
    line = assert_user_error(capsys, ["--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", spaced_only[1:],
                                      "--distractor", " garden", "--out", tmp_path],
                             f"--answer {spaced_only[1:]!r} is ", "tokens")
    assert f"did you mean {spaced_only!r}" in line, line


def test_pairs_file_reproduces_the_16_prompt_induction_circuit(model, tmp_path, capsys):
    """``--pairs examples/induction_pairs.jsonl`` (the 16 prompts of tests/test_induction_circuit.py, as the
    scale jobs read them): the same EAP-IG scores as ``eap`` on those tensors, and the README's circuit,
    7 edges at faithfulness 0.982."""
    import json

    from test_induction_circuit import induction_prompts

    path = Path(__file__).resolve().parent.parent / "examples" / "induction_pairs.jsonl"
    clean, corrupted, metric = induction_prompts(16, 0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["clean"] for r in records] == clean.tolist() and [r["corrupted"] for r in records] == corrupted.tolist()
    assert [r["answer"] for r in records] == metric.correct.tolist()
    assert [r["distractor"] for r in records] == metric.wrong.tolist()

    code, out, err = run_cli(capsys, "--pairs", path, "--steps", 5, "--no-progress", "--out", tmp_path)
    assert code == 0 and err == "", err
    graph = Graph.load_json(tmp_path / "graph.json")
    direct = eap(model, clean, corrupted, metric, method="EAP-IG-inputs", steps=5)
    assert torch.equal(graph.scores.nan_to_num(), direct.scores.nan_to_num())
    meta = graph.metadata
    assert meta["n_pairs"] == 16 and meta["circuit_size"] == 7, meta["circuit_size"]
    assert 0.97 < meta["circuit_faithfulness"] < 0.99, meta["circuit_faithfulness"]  # measured 0.982
    assert "mean logit difference answer - distractor over 16 pairs" in out
    nodes = graph.nodes_in_circuit()
    assert "a0.h2" in nodes and "a1.h0" in nodes, nodes


def test_pairs_argument_errors(capsys, tmp_path):
    good = Path(__file__).resolve().parent.parent / "examples" / "induction_pairs.jsonl"
    out = ["--out", tmp_path / "o"]
    assert_user_error(capsys, ["--pairs", good, "--answer", " letter"] + out, "--pairs", "drop --answer")
    assert_user_error(capsys, ["--clean", CLEAN, "--answer", " letter"] + out,
                      "give --corrupted, --distractor", "or --pairs FILE")
    assert_user_error(capsys, ["--pairs", tmp_path / "none.jsonl"] + out, "none.jsonl", "do not exist")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"clean": [0, 5, 6], "corrupted": [0, 7, 6], "answer": 5, "distractor": 7}\n'
                     '{"clean": [0, 5, 6, 8], "corrupted": [0, 7, 6, 8], "answer": 5, "distractor": 7}\n')
    assert_user_error(capsys, ["--pairs", mixed] + out, "mixed.jsonl line 2 is 4 tokens")
    same = tmp_path / "same.jsonl"
    same.write_text('{"clean": [0, 5, 6], "corrupted": [0, 7, 6], "answer": 5, "distractor": 5}\n')
    assert_user_error(capsys, ["--pairs", same] + out, "same.jsonl line 1 has the same token")
    typo = tmp_path / "typo.jsonl"
    typo.write_text('{"clean": [0, 5, 6], "corrupted": [0, 7, 6], "answr": 5, "distractor": 7}\n')
    assert_user_error(capsys, ["--pairs", typo] + out, "typo.jsonl")
