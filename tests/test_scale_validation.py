"""Scale commands validate the whole job before any Ray cluster or worker starts: every bad argument is the
same one line with --ray as without, ``ray.init`` is never called, and no output folder is left behind.
One real cluster checks that an error raised inside a worker comes back as that same one line too.
"""

import json
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
ray = pytest.importorskip("ray")

from glassbox import Config, HookedTransformer  # noqa: E402
from glassbox.cli import main  # noqa: E402
from glassbox.weights import save_pretrained  # noqa: E402

PAIR = {"clean": "When Mary and John went to the store, John gave a drink to",
        "corrupted": "When Mary and John went to the store, Mary gave a drink to", "answer": " Mary",
        "distractor": " John"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("validation")
    torch.manual_seed(5)
    save_pretrained(HookedTransformer(Config(d_model=16, n_layers=2, n_heads=2, d_vocab=50257, n_ctx=32, d_mlp=28)),
                    root / "model")
    (root / "corpus.txt").write_text("Emma Woodhouse, handsome, clever, and rich, with a comfortable home.\n" * 4)
    (root / "pairs.jsonl").write_text("\n".join(json.dumps(PAIR) for _ in range(4)) + "\n")
    (root / "bad_ids.jsonl").write_text(json.dumps({"clean": [50256, 7, 50257], "corrupted": [50256, 7, 8],
                                                    "answer": 3, "distractor": 4}) + "\n")
    (root / "broken.jsonl").write_text('{"clean": "a",\n')
    (root / "long.jsonl").write_text(json.dumps({"clean": [7] * 33, "corrupted": [8] * 33, "answer": 3,
                                                 "distractor": 4}) + "\n")
    (root / "damaged").mkdir()
    for name in ("model.safetensors", "vocab.json", "merges.txt"):
        (root / "damaged" / name).write_bytes((root / "model" / name).read_bytes())
    (root / "damaged" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": "two"}))
    datasets.Dataset.from_dict({"input_ids": [[50256] + [11] * 8] * 4}).save_to_disk(str(root / "tokens"))
    datasets.Dataset.from_dict({"input_ids": [[50256] + [11] * 8] * 3 + [[50256] + [60000] * 8]}).save_to_disk(
        str(root / "bad_tokens"))
    return root


@pytest.fixture()
def no_cluster(monkeypatch):
    """ray.init recorded and refused: a command that reaches it has started a cluster."""
    calls = []

    def init(*args, **kwargs):
        calls.append((args, kwargs))
        raise RuntimeError("ray.init was called")

    monkeypatch.setattr(ray, "init", init)
    return calls


def cases(root: Path) -> dict:
    """name -> (argv without --out and --ray, what the error must say)."""
    model, text, pairs = str(root / "model"), str(root / "corpus.txt"), str(root / "pairs.jsonl")
    export = ["export", "--model", model, "--text", text, "--context-size", "9"]
    on_dataset = ["export", "--model", model, "--dataset", str(root / "tokens")]
    sweep = ["sweep", "--model", model, "--pairs", pairs, "--activation", "resid_pre", "--axes", "layer"]
    atp = ["attribute", "--model", model, "--pairs", pairs, "--activation", "z", "--axes", "layer,head"]
    evaluate = ["evaluate", "--model", model, "--pairs", pairs]
    return {
        "export: unknown hook": (export + ["--hooks", "blocks.9.hook_resid_post"], "blocks.9.hook_resid_post"),
        "export: unknown hook, dataset": (on_dataset + ["--hooks", "blocks.0.hook_resid_pots"], "hook_resid_pots"),
        "export: hook without a position axis": (export + ["--hooks", "blocks.0.attn.hook_pattern"], "hook_pattern"),
        "export: no such model": (export[:2] + [str(root / "nope")] + export[3:] + ["--hooks", "hook_embed"], "nope"),
        "export: no such model, dataset": (["export", "--model", str(root / "nope"), "--dataset", str(root / "tokens"),
                                            "--hooks", "hook_embed"], "nope"),
        "export: damaged config, dataset": (["export", "--model", str(root / "damaged"), "--dataset",
                                             str(root / "tokens"), "--hooks", "hook_embed"], "n_layer"),
        "export: no such text": (["export", "--model", model, "--text", str(root / "none.txt"), "--hooks",
                                  "hook_embed"], "none.txt"),
        "export: no such dataset": (["export", "--model", model, "--dataset", str(root / "none"), "--hooks",
                                     "hook_embed"], "none"),
        "export: shard size": (export + ["--hooks", "hook_embed", "--batch-size", "4", "--shard-size", "6"],
                               "multiple of batch_size=4"),
        "export: windows longer than n_ctx": (export[:-1] + ["33", "--hooks", "hook_embed"], "n_ctx=32"),
        "sweep: a pair longer than n_ctx": (sweep[:4] + [str(root / "long.jsonl")] + sweep[5:], "n_ctx=32"),
        "evaluate: a pair longer than n_ctx": (evaluate[:4] + [str(root / "long.jsonl")], "n_ctx=32"),
        "export: zero workers": (export + ["--hooks", "hook_embed", "--workers", "0"], "--workers"),
        "sweep: unknown activation": (sweep[:6] + ["resid_prex"] + sweep[7:], "resid_prex"),
        "sweep: unknown hook template": (sweep[:6] + ["blocks.{L}.hook_nope"] + sweep[7:], "hook_nope"),
        "sweep: unknown axis": (sweep[:8] + ["layer,nope"], "'nope'"),
        "sweep: axes without layer": (sweep[:8] + ["pos"], "start with 'layer'"),
        "sweep: no such model": (sweep[:2] + [str(root / "nope")] + sweep[3:], "nope"),
        "sweep: no such pairs": (sweep[:4] + [str(root / "none.jsonl")] + sweep[5:], "none.jsonl"),
        "sweep: broken pairs": (sweep[:4] + [str(root / "broken.jsonl")] + sweep[5:], "broken.jsonl line 1"),
        "sweep: token id outside the vocabulary": (sweep[:4] + [str(root / "bad_ids.jsonl")] + sweep[5:],
                                                   "token id 50257"),
        "attribute: unknown axis": (atp[:8] + ["layer,kv"], "'kv'"),
        "attribute: no such model": (atp[:2] + [str(root / "nope")] + atp[3:], "nope"),
        "attribute: EAP with a token id outside": (["attribute", "--model", model, "--pairs",
                                                    str(root / "bad_ids.jsonl"), "--method", "EAP"], "token id 50257"),
        "evaluate: token id outside the vocabulary": (evaluate[:4] + [str(root / "bad_ids.jsonl")], "token id 50257"),
        "evaluate: no such model": (evaluate[:2] + [str(root / "nope")] + evaluate[3:], "nope"),
    }


CASES = sorted(cases(Path("/")))


def run_main(argv: list) -> int:
    """main's exit status; argparse's own errors exit through SystemExit."""
    try:
        return main(argv)
    except SystemExit as error:
        return error.code


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("use_ray", [True, False], ids=["ray", "local"])
def test_a_bad_job_is_one_line_and_starts_no_cluster(root, case, use_ray, no_cluster, capsys, tmp_path):
    argv, said = cases(root)[case]
    out = tmp_path / "out"
    extra = ["--out", str(out), "--no-progress"] + (["--ray"] if use_ray else [])
    if "--workers" in argv and not use_ray:
        pytest.skip("--workers needs --ray")
    assert run_main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    command = argv[0]
    assert len(err.splitlines()) == 1 and err.startswith(f"glassbox {command}: error: "), err
    assert said in err, err
    assert no_cluster == []
    assert not out.exists()


def test_an_error_raised_in_a_worker_comes_back_as_the_same_one_line(root, capsys, tmp_path):
    """A token id past the vocabulary in row 3 of a dataset is found only when a worker reads that row."""
    argv = ["export", "--model", str(root / "model"), "--dataset", str(root / "bad_tokens"), "--hooks",
            "blocks.0.hook_resid_post", "--batch-size", "2", "--shard-size", "2", "--no-progress"]
    assert main(argv + ["--out", str(tmp_path / "local")]) == 2
    local = capsys.readouterr().err.strip()
    assert main(argv + ["--out", str(tmp_path / "ray"), "--ray", "--workers", "1"]) == 2
    on_ray = capsys.readouterr().err.strip()
    for err in (local, on_ray):
        assert len(err.splitlines()) == 1, err
        assert err.startswith("glassbox export: error: ") and "window 3 holds token id 60000" in err, err
    assert on_ray.endswith(local.split("error: ", 1)[1])  # the worker's message, prefixed with where it ran
    assert "shard 1" in on_ray
