"""``glassbox train`` refusing mistakes, run as a subprocess: exactly one line on stderr,
``glassbox train: error: ...`` naming the value and what is accepted, exit code 2, no traceback,
and nothing on disk changed (a folder holding a run keeps every byte). Also: a run killed between
the checkpoint's two renames resumes to the uninterrupted result, and ``--overwrite`` replaces."""

import json
import os
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from glassbox.cli import main

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
TINY = ["--layers", "1", "--d-model", "15", "--heads", "3", "--n-ctx", "19", "--vocab-size", "300",
        "--steps", "4", "--batch-size", "2", "--eval-every", "2", "--checkpoint-every", "2", "--seed", "5",
        "--heldout-frac", "0.1",  # not the default: --resume must take it from the run
        "--no-progress"]
MARKER_NAME = "pickle-ran"


def glassbox(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "glassbox", "train", *map(str, argv)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-errors")
    (root / "text.txt").write_text(AUSTEN.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (root / "other.txt").write_text(AUSTEN.read_text(encoding="utf-8")[20_000:40_000], encoding="utf-8")
    assert main(["train", "--text", str(root / "text.txt"), "--out", str(root / "run"), *TINY]) == 0
    return root


def setup_case(root: Path, name: str, setup: str) -> Path:
    """A fresh folder for one case; ``setup`` says what ``out`` holds before the command."""
    case = root / "cases" / name
    case.mkdir(parents=True)
    (case / "empty.txt").write_text("")
    (case / "blank.txt").write_text("\n\n  \n")
    (case / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" * 40)
    (case / "short.txt").write_text("one line only\n")
    (case / "tiny.txt").write_text("A few words.\nAnd a few more.\nThe end.\n" * 20)
    (case / "ab.txt").write_text("abababab\n" * 400)  # compresses to far fewer tokens than bytes
    (case / "afile").write_text("x")
    if setup in ("run", "foreign"):
        shutil.copytree(root / "run", case / "out")
    if setup == "foreign":
        (case / "out" / "notes.md").write_text("mine")
    if setup == "emptydir":
        (case / "out").mkdir()
    return case


DAMAGE = {
    "truncated": lambda ckpt: (ckpt / "model.safetensors").write_bytes(
        (ckpt / "model.safetensors").read_bytes()[:300]),
    "garbage": lambda ckpt: (ckpt / "trainer_state.pt").write_bytes(b"not a checkpoint at all" * 9),
    "code": lambda ckpt: torch.save({"step": Evil()}, ckpt / "trainer_state.pt"),
}


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER_NAME}",))


T = "text.txt"  # relative names resolve in the case folder (the subprocess's cwd) or the root
# id: (setup of out, argv, what the one error line must contain)
CASES = {
    "empty text": ("none", ["--text", "empty.txt", "--out", "out"], ["empty.txt", "is empty"]),
    "blank text": ("none", ["--text", "blank.txt", "--out", "out"], ["blank.txt", "is empty"]),
    "binary text": ("none", ["--text", "binary.txt", "--out", "out"], ["binary.txt", "not UTF-8", "0x89"]),
    "missing text": ("none", ["--text", "nope.txt", "--out", "out"], ["nope.txt", "no such file"]),
    "text is a folder": ("emptydir", ["--text", "out", "--out", "out2"], ["--text out", "is a folder"]),
    "one-line text": ("none", ["--text", "short.txt", "--out", "out"], ["short.txt", "held-out", "line"]),
    "n-ctx over the bytes": ("none", ["--text", "tiny.txt", "--out", "out", "--n-ctx", "128"],
                             ["--n-ctx 128", "bytes", "smaller --n-ctx"]),
    "n-ctx over the tokens": ("none", ["--text", "ab.txt", "--out", "out", "--n-ctx", "100", "--vocab-size", "300"],
                              ["--n-ctx 100", "tokens", "held-out"]),
    "steps 0": ("none", ["--text", T, "--out", "out", "--steps", "0"], ["--steps", "'0'", ">= 1"]),
    "steps abc": ("none", ["--text", T, "--out", "out", "--steps", "abc"], ["--steps", "'abc'", "whole number"]),
    "batch 0": ("none", ["--text", T, "--out", "out", "--batch-size", "0"], ["--batch-size", "'0'", ">= 1"]),
    "lr -1": ("none", ["--text", T, "--out", "out", "--lr", "-1"], ["--lr", "'-1'", "> 0"]),
    "lr inf": ("none", ["--text", T, "--out", "out", "--lr", "inf"], ["--lr", "'inf'", "finite"]),
    "lr nan": ("none", ["--text", T, "--out", "out", "--lr", "nan"], ["--lr", "'nan'", "finite"]),
    "grad-clip nan": ("none", ["--text", T, "--out", "out", "--grad-clip", "nan"], ["--grad-clip", "'nan'", "finite"]),
    "weight-decay nan": ("none", ["--text", T, "--out", "out", "--weight-decay", "nan"],
                         ["--weight-decay", "'nan'", "finite"]),
    "weight-decay -1": ("none", ["--text", T, "--out", "out", "--weight-decay", "-1"], ["--weight-decay", ">= 0"]),
    "heads 3": ("none", ["--text", T, "--out", "out", "--heads", "3"], ["--heads 3", "--d-model 128", "1, 2, 4"]),
    "layers 0": ("none", ["--text", T, "--out", "out", "--layers", "0"], ["--layers", "'0'", ">= 1"]),
    "d-model -5": ("none", ["--text", T, "--out", "out", "--d-model", "-5"], ["--d-model", "'-5'", ">= 1"]),
    "n-ctx 0": ("none", ["--text", T, "--out", "out", "--n-ctx", "0"], ["--n-ctx", "'0'", ">= 1"]),
    "vocab 10": ("none", ["--text", T, "--out", "out", "--vocab-size", "10"], ["--vocab-size", "'10'", ">= 258"]),
    "threads 0": ("none", ["--text", T, "--out", "out", "--threads", "0"], ["--threads", "'0'", ">= 1"]),
    "eval-every 0": ("none", ["--text", T, "--out", "out", "--eval-every", "0"], ["--eval-every", "'0'"]),
    "checkpoint-every -1": ("none", ["--text", T, "--out", "out", "--checkpoint-every", "-1"],
                            ["--checkpoint-every", "'-1'", ">= 0"]),
    "max-copies 1": ("none", ["--text", T, "--out", "out", "--max-copies", "1"], ["--max-copies", "'1'", ">= 2"]),
    "init-range 0": ("none", ["--text", T, "--out", "out", "--init-range", "0"], ["--init-range", "'0'", "> 0"]),
    "heldout 0": ("none", ["--text", T, "--out", "out", "--heldout-frac", "0"], ["--heldout-frac", "'0'", "> 0", "< 1"]),
    "heldout 1": ("none", ["--text", T, "--out", "out", "--heldout-frac", "1"], ["--heldout-frac", "'1'", "< 1"]),
    "repeat 1.5": ("none", ["--text", T, "--out", "out", "--repeat-frac", "1.5"], ["--repeat-frac", "'1.5'", "<= 1"]),
    "repeat -0.1": ("none", ["--text", T, "--out", "out", "--repeat-frac", "-0.1"], ["--repeat-frac", ">= 0"]),
    "random-repeat 2": ("none", ["--text", T, "--out", "out", "--random-repeat-frac", "2"],
                        ["--random-repeat-frac", "'2'"]),
    "warmup over steps": ("none", ["--text", T, "--out", "out", "--steps", "10", "--warmup-steps", "50"],
                          ["--warmup-steps 50", "--steps 10"]),
    "repeat too long": ("none", ["--text", T, "--out", "out", "--repeat-frac", "0.5", "--min-repeat", "100"],
                        ["--min-repeat 100", "--n-ctx 128", "at most 64"]),
    "device nonsense": ("none", ["--text", T, "--out", "out", "--device", "nonsense"], ["--device", "'nonsense'"]),
    "device cuda": ("none", ["--text", T, "--out", "out", "--device", "cuda"], ["--device", "'cuda'", "CUDA"]),
    "out is a file": ("none", ["--text", T, "--out", "afile"], ["--out afile", "is a file"]),
    "out under a file": ("none", ["--text", T, "--out", "afile/run"], ["afile", "is a file"]),
    "resume nothing": ("none", ["--text", T, "--out", "out", "--resume"], ["--resume", "nothing to resume", "out"]),
    "resume empty dir": ("emptydir", ["--text", T, "--out", "out", "--resume"], ["nothing to resume"]),
    "resume and overwrite": ("run", ["--text", T, "--out", "out", "--resume", "--overwrite"], ["--overwrite"]),
    # A folder holding a trained run: nothing in it may change.
    "run: bad flag": ("run", ["--text", T, "--out", "out", *TINY, "--lr", "nan"], ["--lr", "'nan'"]),
    "run: same settings": ("run", ["--text", T, "--out", "out", *TINY], ["not empty", "step 4", "--resume"]),
    "run: other settings": ("run", ["--text", T, "--out", "out", *TINY, "--layers", "2"],
                            ["not empty", "--overwrite"]),
    "run: overwrite, n-ctx too long": ("run", ["--text", "tiny.txt", "--out", "out", "--overwrite", "--n-ctx", "128"],
                                       ["--n-ctx 128"]),
    "run: overwrite, bad heads": ("run", ["--text", T, "--out", "out", "--overwrite", "--heads", "7"], ["--heads 7"]),
    "run: foreign file": ("foreign", ["--text", T, "--out", "out", "--overwrite"], ["notes.md", "new or empty"]),
    "run: resume other lr": ("run", ["--text", T, "--out", "out", "--resume", "--lr", "0.01"],
                             ["--lr 0.01", "the run's 0.001"]),
    "run: resume other text": ("run", ["--text", "other.txt", "--out", "out", "--resume"],
                               ["other.txt", "not the text"]),
    "run: resume truncated checkpoint": ("run:truncated", ["--text", T, "--out", "out", "--resume"],
                                         ["model.safetensors", "damaged"]),
    "run: resume garbage checkpoint": ("run:garbage", ["--text", T, "--out", "out", "--resume"],
                                       ["trainer_state.pt", "damaged"]),
    "run: resume code in checkpoint": ("run:code", ["--text", T, "--out", "out", "--resume"],
                                       ["trainer_state.pt", "unsafe"]),
}


# Variants of a check that a subprocess case already covers (the same argparse type, the same
# code path) run in-process through ``main``, which is all ``python -m glassbox`` runs: a subprocess
# costs seconds (importing torch), and the machine is shared.
IN_PROCESS = {"steps abc", "lr inf", "weight-decay -1", "d-model -5", "n-ctx 0", "vocab 10", "threads 0",
              "eval-every 0", "checkpoint-every -1", "max-copies 1", "init-range 0", "heldout 1", "repeat -0.1",
              "random-repeat 2", "blank text", "text is a folder", "out under a file", "resume empty dir"}


def run_in_process(argv, cwd: Path) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback

    err, out, old = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(["train", *argv])
            except SystemExit as exit_:
                code = exit_.code
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def results(root):
    """Every case, the subprocesses four at a time, with the folder before and after."""
    prepared = {}
    for i, (name, (setup, argv, _)) in enumerate(CASES.items()):
        case = setup_case(root, f"case{i}", setup.split(":")[0])
        shutil.copy(root / "text.txt", case / T)
        shutil.copy(root / "other.txt", case / "other.txt")
        if ":" in setup:
            DAMAGE[setup.split(":")[1]](case / "out" / "checkpoint")
        prepared[name] = (case, snapshot(case))

    def launch(name):
        case, _ = prepared[name]
        return name, glassbox(*CASES[name][1], cwd=case)

    done = {name: run_in_process(CASES[name][1], prepared[name][0]) for name in IN_PROCESS}
    with ThreadPoolExecutor(max_workers=4) as pool:
        done.update(pool.map(launch, [name for name in CASES if name not in IN_PROCESS]))
    return {name: (done[name], before, snapshot(case), case) for name, (case, before) in prepared.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_mistake_is_one_line_exit_2_and_changes_nothing(results, name):
    if name == "device cuda" and torch.cuda.is_available():
        pytest.skip("this torch build has CUDA")
    proc, before, after, case = results[name]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith("glassbox train: error: "), lines[0]
    for words in CASES[name][2]:
        assert words in lines[0], (words, lines[0])
    assert after == before, "the refused command changed files on disk"
    assert not (case / MARKER_NAME).exists(), "loading the checkpoint ran code"


def train_killed(root: Path, out: Path, patch: str) -> None:
    """``glassbox train`` into ``out`` in a subprocess where ``patch`` (code run first, with os and
    signal imported) SIGKILLs the process at the point it chooses; asserts that it was killed."""
    script = "import os, signal, sys\n" + patch + "from glassbox.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", script, "train", "--text", str(root / "text.txt"),
                           "--out", str(out), *TINY], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_killed_between_the_checkpoint_renames_resumes_to_the_uninterrupted_run(root, tmp_path):
    # Kill the process (SIGKILL, no clean-up) in the middle of a checkpoint's renames: its journal is in
    # place, the new weights renamed in, the new trainer state not yet (a mix, until recovered).
    out = tmp_path / "killed"
    train_killed(root, out, (
        "real = os.replace\n"
        "def replace(src, dst, *a, **k):\n"
        "    real(src, dst, *a, **k)\n"
        "    if str(dst).endswith(os.sep + 'checkpoint' + os.sep + 'model.safetensors'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.replace = replace\n"))
    assert (out / "checkpoint" / ".glassbox-journal.json").is_file()
    resumed = glassbox("--text", root / "text.txt", "--out", out, "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    assert (out / "model.safetensors").read_bytes() == (root / "run" / "model.safetensors").read_bytes()
    log = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3, 4]


def test_resume_after_a_kill_mid_run_drops_the_log_lines_it_trains_again(root, tmp_path):
    # Killed while computing step 4's loss: the checkpoint is step 2's, the log has steps 1 to 3.
    out = tmp_path / "run"
    train_killed(root, out, (
        "from glassbox.train.loop import Trainer\n"
        "real, calls = Trainer.loss, []\n"
        "def loss(self, *a):\n"
        "    calls.extend([1] if self.model.training else [])\n"
        "    if len(calls) == 4:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(self, *a)\n"
        "Trainer.loss = loss\n"))
    with open(out / "train_log.jsonl", "a") as log:
        log.write('{"step": 4, "lo')  # as a kill in mid-write would leave it
    resumed = glassbox("--text", root / "text.txt", "--out", out, "--resume", "--no-progress")
    assert resumed.returncode == 0 and "resuming at step 2 of 4" in resumed.stdout, resumed.stderr
    log = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log == [1, 2, 3, 4]
    assert (out / "model.safetensors").read_bytes() == (root / "run" / "model.safetensors").read_bytes()


def test_overwrite_replaces_a_run_with_other_settings(root, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    args = TINY[:TINY.index("--steps")] + ["--steps", "2", "--batch-size", "2", "--arch", "classic", "--no-progress"]
    assert main(["train", "--text", str(root / "text.txt"), "--out", str(out), "--overwrite", *args]) == 0
    assert not (out / "model.safetensors").exists(), "a stale export of the replaced run is left"
    settings = json.loads((out / "train_settings.json").read_text())["settings"]
    assert settings["arch"] == "classic" and settings["steps"] == 2
    assert [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()] == [1, 2]
