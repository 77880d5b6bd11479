"""A resume is refused, naming what changed, when anything that determines the numbers changed: the model's
weights, config or tokenizer at the same path, its dtype, the corpus or pairs, the hooks, the shard size.

The oracle for a fingerprint is hashlib over the files listed by hand; for "refused" it is a byte-for-byte
snapshot of the output folder before and after the refused call.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")

from glassbox import Config, HookedTransformer  # noqa: E402
from glassbox.cli import main  # noqa: E402
from glassbox.scale import export, run_job  # noqa: E402
from glassbox.scale.fingerprint import model_fingerprint  # noqa: E402
from glassbox.scale.ray_worker import ShardWorker  # noqa: E402
from glassbox.weights import save_pretrained  # noqa: E402
from glassbox.weights.pretrained import SHIPPED_DIR  # noqa: E402

from test_scale_folders import snapshot  # noqa: E402
from test_scale_job import Squares  # noqa: E402

TEXT = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition.\n" * 4
PAIR = {"clean": "When Mary and John went to the store, John gave a drink to",
        "corrupted": "When Mary and John went to the store, Mary gave a drink to", "answer": " Mary",
        "distractor": " John"}
TOKENIZER = ["merges.txt", "tokenizer.json", "tokenizer_config.json", "vocab.json"]


def save_model(folder: Path, seed: int) -> None:
    torch.manual_seed(seed)
    save_pretrained(HookedTransformer(Config(d_model=16, n_layers=2, n_heads=2, d_vocab=50257, n_ctx=32, d_mlp=28)),
                    folder)


@pytest.fixture()
def root(tmp_path):
    save_model(tmp_path / "model", seed=5)
    (tmp_path / "corpus.txt").write_text(TEXT)
    (tmp_path / "pairs.jsonl").write_text("\n".join(json.dumps(PAIR) for _ in range(4)) + "\n")
    return tmp_path


def by_hand(folder: Path, names) -> dict:
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": hashlib.sha256((folder / n).read_bytes()).hexdigest()}
            for n in names}


def test_the_fingerprint_is_every_byte_of_the_config_weights_and_tokenizer(root):
    record = model_fingerprint({"name_or_path": str(root / "model")}).record
    assert record["files"] == by_hand(root / "model", ["config.json", "model.safetensors"] + TOKENIZER)
    assert "generation_config.json" not in record["files"]  # does not change a forward's numbers


def test_a_shipped_model_name_is_fingerprinted_by_its_files():
    record = model_fingerprint({"name_or_path": "glassbox-austen"}).record
    folder = SHIPPED_DIR / "glassbox-austen"
    assert record["folder"] == str(folder.resolve())
    assert record["files"] == by_hand(folder, ["config.json", "model.safetensors"] + TOKENIZER)


def export_args(root: Path, out: Path, *extra: str) -> list:
    return ["export", "--model", str(root / "model"), "--text", str(root / "corpus.txt"), "--hooks",
            "blocks.0.hook_resid_post", "--out", str(out), "--context-size", "11", "--batch-size", "2",
            "--shard-size", "2", "--no-progress", *extra]


def half_done(out: Path) -> None:
    """As an interrupted export leaves it: the last shard never committed."""
    manifest = json.loads((out / "manifest.json").read_text())
    last = str(len(manifest["plan"]) - 1)
    del manifest["shards"][last]
    (out / "manifest.json").write_text(json.dumps(manifest))


def edit_json(path: Path, **fields) -> None:
    value = json.loads(path.read_text())
    value.update(fields)
    path.write_text(json.dumps(value))


CHANGES = {
    "weights": (lambda root: save_model(root / "model", seed=6), "model's file model.safetensors changed"),
    "config": (lambda root: edit_json(root / "model" / "config.json", layer_norm_epsilon=1e-3),
               "model's file config.json changed"),
    "tokenizer": (lambda root: edit_json(root / "model" / "tokenizer_config.json", model_max_length=77),
                  "model's file tokenizer_config.json changed"),
    "a tokenizer file added": (lambda root: (root / "model" / "added_tokens.json").write_text("{}"),
                               "model now has a file added_tokens.json"),
    "the corpus": (lambda root: (root / "corpus.txt").write_text(TEXT.replace("Emma", "Harriet")),
                   r"params\.corpus\.sha256"),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_export_resume_after_an_input_changed_is_refused_naming_it(root, case, capsys):
    out = root / "out"
    assert main(export_args(root, out)) == 0
    half_done(out)
    before = snapshot(out)
    change, message = CHANGES[case]
    change(root)
    capsys.readouterr()
    assert main(export_args(root, out, "--resume")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("glassbox export: error: cannot resume")
    assert re.search(message, err), err
    assert snapshot(out) == before  # nothing recomputed, nothing deleted


@pytest.mark.parametrize("flag, message", [(("--dtype", "float64"), r"model_spec\.dtype was \"float32\""),
                                           (("--shard-size", "4"), r"params\.shard_size was 2"),
                                           (("--hooks", "blocks.1.hook_resid_post"), r"params\.hooks")])
def test_export_resume_with_another_flag_is_refused_naming_it(root, flag, message, capsys):
    out = root / "out"
    assert main(export_args(root, out)) == 0
    half_done(out)
    before = snapshot(out)
    args = export_args(root, out, "--resume")
    if flag[0] in args:
        i = args.index(flag[0])
        args[i + 1] = flag[1]
    else:
        args += list(flag)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert snapshot(out) == before


def test_a_dataset_rewritten_under_its_old_state_json_is_refused(root):
    rows = torch.randint(0, 50257, (6, 9), generator=torch.Generator().manual_seed(0))
    datasets.Dataset.from_dict({"input_ids": rows.tolist()}).save_to_disk(str(root / "tokens"))
    datasets.Dataset.from_dict({"input_ids": (rows.flip(0)).tolist()}).save_to_disk(str(root / "other"))
    out = root / "out"
    export(str(root / "model"), out, ["blocks.0.hook_resid_post"], dataset=root / "tokens", batch_size=2,
           shard_size=2, progress=False)
    half_done(out)
    before = snapshot(out)
    (arrow,) = (root / "tokens").glob("*.arrow")
    (other,) = (root / "other").glob("*.arrow")
    arrow.write_bytes(other.read_bytes())  # other tokens; state.json (its fingerprint) as it was
    with pytest.raises(ValueError, match=r"params\.corpus\.files\.data-00000-of-00001\.arrow"):
        export(str(root / "model"), out, ["blocks.0.hook_resid_post"], dataset=root / "tokens", batch_size=2,
               shard_size=2, progress=False, resume=True)
    assert snapshot(out) == before


@pytest.mark.parametrize("command", ["sweep", "attribute", "evaluate"])
def test_pair_jobs_refuse_a_resume_after_the_weights_changed(root, command, capsys):
    out = root / "out"
    args = [command, "--model", str(root / "model"), "--pairs", str(root / "pairs.jsonl"), "--out", str(out),
            "--batch-size", "2", "--shard-size", "2", "--no-progress"]
    if command != "evaluate":
        args += ["--activation", "resid_pre", "--axes", "layer"]
    assert main(args) == 0
    assert not (out / ".tmp").exists()  # a successful run leaves no .tmp
    half_done(out)
    before = snapshot(out)
    save_model(root / "model", seed=6)
    capsys.readouterr()
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model's file model.safetensors changed" in err, err
    assert snapshot(out) == before
    save_model(root / "model", seed=5)  # the same bytes again: the resume goes ahead
    assert main(args + ["--resume"]) == 0


def test_a_factory_whose_module_changed_is_refused(tmp_path, monkeypatch):
    (tmp_path / "fp_factory.py").write_text("def make(device=None, dtype=None):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Job(Squares):
        def model_spec(self):
            return {"factory": "fp_factory:make"}

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(Job(fail_at=2), out, model=object(), progress=False)
    (tmp_path / "fp_factory.py").write_text("def make(device=None, dtype=None):\n    return 1\n")
    with pytest.raises(ValueError, match="source of the model factory fp_factory:make's module changed"):
        run_job(Job(), out, model=object(), progress=False, resume=True)


def test_weights_changed_between_the_fingerprint_and_the_build_are_refused(root, monkeypatch):
    import glassbox.scale.local as local

    real = local.build_model

    def build_after_a_change(spec):
        save_model(root / "model", seed=6)
        return real(spec)

    monkeypatch.setattr(local, "build_model", build_after_a_change)
    out = root / "out"
    with pytest.raises(ValueError, match="model.safetensors changed after it was fingerprinted"):
        export(str(root / "model"), out, ["blocks.0.hook_resid_post"], text=root / "corpus.txt", context_size=11,
               batch_size=2, shard_size=2, progress=False)
    assert not out.exists()  # nothing was committed, nothing is left


def test_a_ray_worker_that_builds_changed_weights_reports_it(root):
    spec = {"name_or_path": str(root / "model"), "device": "cpu", "dtype": "float32"}
    fingerprint = model_fingerprint(spec)
    (root / "probe").write_text("token")
    assert ShardWorker(None, spec, str(root / "probe"), "token", 1, fingerprint).error is None
    save_model(root / "model", seed=6)
    worker = ShardWorker(None, spec, str(root / "probe"), "token", 1, fingerprint)
    with pytest.raises(ValueError, match="model.safetensors changed after it was fingerprinted"):
        worker.info()


def test_a_hub_repo_id_is_fingerprinted_by_its_snapshots_files(root, tmp_path, monkeypatch):
    from hub_cache import write_hub_cache

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = write_hub_cache(cache, "org/tiny", root / "model")
    record = model_fingerprint({"name_or_path": "org/tiny"}).record
    assert record["files"] == by_hand(first, ["config.json", "model.safetensors"] + TOKENIZER)
    out = root / "out"
    options = dict(text=root / "corpus.txt", context_size=11, batch_size=2, shard_size=2, progress=False)
    export("org/tiny", out, ["blocks.0.hook_resid_post"], **options)
    half_done(out)
    before = snapshot(out)
    save_model(root / "retrained", seed=6)
    write_hub_cache(cache, "org/tiny", root / "retrained")  # a new commit; refs/main moves to it
    with pytest.raises(ValueError, match="model's file model.safetensors changed"):
        export("org/tiny", out, ["blocks.0.hook_resid_post"], resume=True, **options)
    assert snapshot(out) == before
