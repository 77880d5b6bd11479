"""The export job: SAELens's cached-activations layout, split-independent, resumable.

The oracle for the columns is a plain forward of the same model with capturing hooks on the same
batches; for ``token_ids`` the tokenizer's own encoding of the whole text, cut into windows by hand.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets")

from glassbox import Config, HookedTransformer  # noqa: E402
from glassbox.scale import ExportJob, dataset_windows, load_manifest, run_job, text_windows, verify  # noqa: E402
from glassbox.weights import from_pretrained, save_pretrained  # noqa: E402

HOOKS = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z", "blocks.1.hook_mlp_out"]
CONTEXT, BATCH = 13, 4
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
        "in want of a wife.\nHowever little known the feelings or views of such a man may be on his first "
        "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families.\n") * 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(3)
    model = HookedTransformer(Config(d_model=20, n_layers=2, n_heads=4, d_head=5, d_vocab=50257, n_ctx=32, d_mlp=36,
                                     init_range=0.2))
    save_pretrained(model, root / "model")
    (root / "corpus.txt").write_text(TEXT)
    spec = {"name_or_path": str(root / "model"), "device": "cpu", "dtype": "float32"}
    model = from_pretrained(root / "model")
    windows = text_windows(root / "corpus.txt", model.tokenizer, CONTEXT)
    return root, spec, model, windows


def columns(out: Path) -> dict:
    ds = datasets.load_from_disk(str(out)).with_format("torch")
    return ds[0:len(ds)]


def exported(root, spec, windows, name, model=None, **options) -> Path:
    """An export; with ``model`` (the one ``spec`` loads) the job skips loading it again."""
    job = ExportJob(spec, windows, HOOKS, batch_size=options.pop("batch_size", BATCH), **options)
    return run_job(job, root / name, progress=False, model=model)


def forward_oracle(model, tokens: torch.Tensor, batch: int, dtype=torch.float32) -> dict:
    out = {h: [] for h in HOOKS}
    for start in range(0, len(tokens), batch):
        seen = {}
        hooks = [(h, lambda act, hook: seen.__setitem__(hook.name, act.detach().clone())) for h in HOOKS]
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            model(tokens[start:start + batch])
        for h in HOOKS:
            act = seen[h]
            out[h].append(act.reshape(*act.shape[:2], -1).to(dtype))
    return {h: torch.cat(v) for h, v in out.items()}


def test_text_windows_are_the_tokenizers_stream_with_a_bos_each(setup):
    root, _, model, windows = setup
    stream = model.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    n = len(stream) // (CONTEXT - 1)
    assert len(windows) == n and n >= 8
    for i in range(n):
        assert windows.rows(i, i + 1)[0].tolist() == [model.tokenizer.bos_token_id] + \
            stream[i * (CONTEXT - 1):(i + 1) * (CONTEXT - 1)]


def test_the_export_is_saelenss_layout_with_the_forwards_activations(setup):
    root, spec, model, windows = setup
    out = exported(root, spec, windows, "one", shard_size=8)
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == HOOKS + ["token_ids"]
    assert {k: (type(v).__name__, getattr(v, "shape", None), getattr(v, "dtype", None)) for k, v in ds.features.items()
            if k != "token_ids"} == {"blocks.0.hook_resid_post": ("Array2D", (CONTEXT, 20), "float32"),
                                     "blocks.1.attn.hook_z": ("Array2D", (CONTEXT, 20), "float32"),
                                     "blocks.1.hook_mlp_out": ("Array2D", (CONTEXT, 20), "float32")}
    assert ds.features["token_ids"] == datasets.Sequence(datasets.Value("int32"), length=CONTEXT)
    cols = columns(out)
    tokens = windows.rows(0, len(windows))
    assert torch.equal(cols["token_ids"], tokens.to(torch.int32))
    oracle = forward_oracle(model, tokens, BATCH)
    for h in HOOKS:
        assert torch.equal(cols[h], oracle[h]), h
    state = json.loads((out / "state.json").read_text())
    n_shards = -(-len(windows) // 8)
    assert [f["filename"] for f in state["_data_files"]] == [f"data-{i:05d}-of-{n_shards:05d}.arrow"
                                                             for i in range(n_shards)]
    for i in range(n_shards):  # hard links to the shards' files: the data is on disk once
        top = os.stat(out / f"data-{i:05d}-of-{n_shards:05d}.arrow")
        shard = os.stat(out / "shards" / f"shard_{i:05d}" / "data-00000-of-00001.arrow")
        assert (top.st_ino, top.st_dev) == (shard.st_ino, shard.st_dev)
    manifest = load_manifest(out)
    assert [(e["token_start"], e["token_stop"], e["rows"]) for e in manifest["shards"].values()] == \
        [(s * CONTEXT, min(s + 8, len(windows)) * CONTEXT, min(s + 8, len(windows)) - s)
         for s in range(0, len(windows), 8)]
    assert manifest["params"]["hooks"] == HOOKS and verify(out) == {}


def test_the_split_never_changes_a_bit(setup):
    root, spec, model, windows = setup
    reference = columns(exported(root, spec, windows, "single", model, shard_size=BATCH * len(windows)))
    for shard_size in (BATCH, 3 * BATCH):
        cols = columns(exported(root, spec, windows, f"split{shard_size}", model, shard_size=shard_size))
        assert cols.keys() == reference.keys()
        for name in reference:
            assert torch.equal(cols[name], reference[name]), (shard_size, name)


def test_the_same_plan_writes_the_same_bytes(setup):
    root, spec, model, windows = setup
    a, b = (exported(root, spec, windows, name, model, shard_size=8) for name in ("bytes_a", "bytes_b"))
    def data_files(out):
        return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")

    names = data_files(a)
    assert names == data_files(b) and len(names) > 5
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_float16_activations_are_the_forward_rounded_once(setup):
    root, spec, model, windows = setup
    out = exported(root, spec, windows, "half", model, shard_size=8, act_dtype="float16")
    ds = datasets.load_from_disk(str(out))
    oracle = forward_oracle(model, windows.rows(0, len(windows)), BATCH, dtype=torch.float16)
    for h in HOOKS:
        assert ds.features[h].dtype == "float16"
        # read the stored Arrow values themselves: datasets' numpy and torch formats widen float16 to float32
        column = ds.data.column(h).combine_chunks()
        assert str(column.type.storage_type) == "list<item: list<item: halffloat>>"
        values = column.storage.flatten().flatten().to_numpy(zero_copy_only=False)
        assert values.dtype == np.float16 and np.array_equal(values, oracle[h].numpy().reshape(-1)), h


def test_a_pretokenized_dataset_is_read_as_is(setup):
    root, spec, model, windows = setup
    tokens = windows.rows(0, len(windows)).numpy()
    for column in ("tokens", "input_ids"):
        folder = root / f"pretok_{column}"
        datasets.Dataset.from_dict({column: tokens, "text": ["x"] * len(tokens)}).save_to_disk(str(folder))
        from_dataset = columns(exported(root, spec, dataset_windows(folder), f"from_{column}", model, shard_size=8))
        from_text = columns(root / "one") if (root / "one").exists() else columns(
            exported(root, spec, windows, "one", model, shard_size=8))
        for name in from_text:
            assert torch.equal(from_dataset[name], from_text[name]), name
    with pytest.raises(ValueError, match="context_size=12 but the rows"):
        dataset_windows(root / "pretok_tokens", context_size=12)
    bare = root / "no_tokens"
    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(str(bare))
    with pytest.raises(ValueError, match="no token column"):
        dataset_windows(bare)


class FailingExport(ExportJob):
    def __init__(self, *args, fail_at=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.calls = fail_at, []

    def run_shard(self, model, spec, tmp_dir):
        self.calls.append(spec.index)
        entry = super().run_shard(model, spec, tmp_dir)
        if spec.index == self.fail_at:
            raise RuntimeError("interrupted on purpose")
        return entry


def test_an_interrupted_and_a_corrupted_export_resume_to_the_same_bytes(setup):
    root, spec, model, windows = setup
    clean = exported(root, spec, windows, "clean", model, shard_size=BATCH)
    out = root / "interrupted"
    with pytest.raises(RuntimeError, match="on purpose"):
        run_job(FailingExport(spec, windows, HOOKS, batch_size=BATCH, shard_size=BATCH, fail_at=2), out, progress=False,
                model=model)
    assert not (out / "state.json").exists()  # nothing consolidated from a half-done export
    resumed = FailingExport(spec, windows, HOOKS, batch_size=BATCH, shard_size=BATCH)
    run_job(resumed, out, progress=False, resume=True, model=model)
    n_shards = -(-len(windows) // BATCH)
    assert resumed.calls == list(range(2, n_shards))
    arrow = out / "shards" / "shard_00001" / "data-00000-of-00001.arrow"
    data = bytearray(arrow.read_bytes())
    data[-200] ^= 1
    arrow.unlink()  # a new file: the top-level hard link keeps the old bytes until consolidation
    arrow.write_bytes(bytes(data))
    assert sorted(verify(out)) == [1]
    again = FailingExport(spec, windows, HOOKS, batch_size=BATCH, shard_size=BATCH)
    run_job(again, out, progress=False, resume=True, model=model)
    assert again.calls == [1]
    for path in sorted(clean.glob("data-*.arrow")) + sorted((clean / "shards").rglob("*.arrow")):
        rel = path.relative_to(clean)
        assert (out / rel).read_bytes() == path.read_bytes(), rel
    clean_cols, out_cols = columns(clean), columns(out)
    for name in clean_cols:
        assert torch.equal(out_cols[name], clean_cols[name]), name


def test_bad_export_arguments_are_refused(setup):
    root, spec, model, windows = setup
    with pytest.raises(ValueError, match="multiple of batch_size=4"):
        ExportJob(spec, windows, HOOKS, batch_size=4, shard_size=6)
    with pytest.raises(ValueError, match="bfloat16"):
        ExportJob(spec, windows, HOOKS, act_dtype="bfloat16")
    with pytest.raises(ValueError, match="distinct"):
        ExportJob(spec, windows, HOOKS + HOOKS[:1])
    with pytest.raises(KeyError, match="blocks.7.hook_resid_post"):
        run_job(ExportJob(spec, windows, ["blocks.7.hook_resid_post"]), root / "bad_hook", progress=False)
    with pytest.raises(ValueError, match="blocks.0.attn.hook_pattern"):
        run_job(ExportJob(spec, windows, ["blocks.0.attn.hook_pattern"]), root / "bad_shape", progress=False)
    with pytest.raises(ValueError, match="fewer than one window"):
        (root / "short.txt").write_text("Hi")
        text_windows(root / "short.txt", model.tokenizer, CONTEXT)


def test_an_export_killed_mid_write_resumes_to_the_same_bytes(setup, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    root, spec, model, windows = setup
    clean = exported(root, spec, windows, "clean_for_kill", model, shard_size=2 * BATCH)
    out, marker = tmp_path / "killed", tmp_path / "marker"
    # The child writes shard 1's first batch, then stops inside its second: a half-written arrow file.
    script = f"""
import time
from pathlib import Path
from glassbox.scale import ExportJob, run_job, text_windows
from glassbox.weights import from_pretrained

class Slow(ExportJob):
    def activations(self, model, tokens):
        if self.calls == 3:
            Path({str(marker)!r}).write_text("mid-shard")
            time.sleep(600)
        self.calls += 1
        return super().activations(model, tokens)

model = from_pretrained({spec['name_or_path']!r})
job = Slow({spec!r}, text_windows({str(root / 'corpus.txt')!r}, model.tokenizer, {CONTEXT}), {HOOKS!r},
           batch_size={BATCH}, shard_size={2 * BATCH})
job.calls = 0
run_job(job, {str(out)!r}, model=model, progress=False)
"""
    child = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert child.poll() is None, "the export ended before the kill"
            assert time.time() < deadline, "the export never reached shard 1's second batch"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert sorted(load_manifest(out)["shards"]) == ["0"]
    (half,) = list((out / ".tmp").iterdir())
    assert half.name.startswith("shard_00001.") and (half / "data-00000-of-00001.arrow").exists()
    resumed = FailingExport(spec, windows, HOOKS, batch_size=BATCH, shard_size=2 * BATCH)
    run_job(resumed, out, progress=False, resume=True, model=model)
    assert resumed.calls == list(range(1, -(-len(windows) // (2 * BATCH))))
    assert not (out / ".tmp").exists()
    for path in sorted(clean.glob("data-*.arrow")) + sorted((clean / "shards").rglob("*")):
        if path.is_file():
            rel = path.relative_to(clean)
            assert (out / rel).read_bytes() == path.read_bytes(), rel
