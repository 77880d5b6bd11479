"""``glassbox export``: the command writes a loadable export, resumes, and says what to install for --ray."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")

from glassbox import Config, HookedTransformer  # noqa: E402
from glassbox.cli import main  # noqa: E402
from glassbox.scale import load_manifest, text_windows  # noqa: E402
from glassbox.weights import from_pretrained, save_pretrained  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXT = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition.\n" * 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_export")
    torch.manual_seed(5)
    save_pretrained(HookedTransformer(Config(d_model=16, n_layers=2, n_heads=2, d_vocab=50257, n_ctx=32, d_mlp=28)),
                    root / "model")
    (root / "corpus.txt").write_text(TEXT)
    return root


def test_export_writes_a_dataset_with_the_models_windows_and_resumes(model_dir, capsys):
    out = model_dir / "out"
    argv = ["export", "--model", str(model_dir / "model"), "--text", str(model_dir / "corpus.txt"), "--hooks",
            "blocks.0.hook_resid_post,blocks.1.hook_resid_pre", "--out", str(out), "--context-size", "11",
            "--batch-size", "3", "--shard-size", "6"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "tok/s" in captured.err and "shards" in captured.err  # the progress bar
    model = from_pretrained(model_dir / "model")
    windows = text_windows(model_dir / "corpus.txt", model.tokenizer, 11)
    ds = datasets.load_from_disk(str(out)).with_format("torch")
    assert ds.column_names == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre", "token_ids"]
    assert torch.equal(ds[0:len(ds)]["token_ids"], windows.rows(0, len(windows)).to(torch.int32))
    # the same value seen at two hook names: resid_post of block 0 is resid_pre of block 1
    assert torch.equal(ds[0:len(ds)]["blocks.0.hook_resid_post"], ds[0:len(ds)]["blocks.1.hook_resid_pre"])
    assert f"exported {len(windows)} windows x 11 tokens" in captured.out
    before = load_manifest(out)["shards"]
    assert main(argv) == 2  # an existing export is not overwritten
    assert "--resume" in capsys.readouterr().err
    assert main(argv + ["--resume", "--no-progress"]) == 0
    assert load_manifest(out)["shards"] == before  # every shard verified, none recomputed


def test_usage_errors_are_one_line(model_dir, capsys):
    base = ["export", "--model", str(model_dir / "model"), "--text", str(model_dir / "corpus.txt"), "--out",
            str(model_dir / "bad"), "--context-size", "11"]
    assert main(base + ["--hooks", "blocks.9.hook_resid_post"]) == 2
    assert "blocks.9.hook_resid_post" in capsys.readouterr().err
    assert not (model_dir / "bad").exists()  # nothing left: the corrected command runs without --resume
    assert main(base + ["--hooks", "blocks.0.hook_resid_post", "--batch-size", "4", "--shard-size", "6"]) == 2
    assert "multiple of batch_size=4" in capsys.readouterr().err
    assert main(base + ["--hooks", "blocks.0.hook_resid_post", "--workers", "2"]) == 2
    assert "--workers needs --ray" in capsys.readouterr().err


def test_ray_without_ray_says_what_to_install(model_dir):
    code = ("import sys; sys.modules['ray'] = None\nfrom glassbox.cli import main\n"
            f"sys.exit(main(['export', '--model', {str(model_dir / 'model')!r}, '--text', "
            f"{str(model_dir / 'corpus.txt')!r}, '--hooks', 'blocks.0.hook_resid_post', '--out', "
            f"{str(model_dir / 'ray_out')!r}, '--ray']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("glassbox export: error: --ray needs the Python package 'ray', which is not "
                                     "installed: pip install -e '.[scale]'")
    assert not (model_dir / "ray_out").exists()
