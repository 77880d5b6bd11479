"""``glassbox --help`` and every subcommand's ``--help`` are answered without importing torch,
transformers or glassbox's models: those imports take seconds, and asking for help should not."""

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "numpy", "plotly", "safetensors", "glassbox.models", "glassbox.weights",
         "glassbox.interp", "glassbox.train", "glassbox.scale", "glassbox.tl")

# In a fresh interpreter: the help of the top level and of each subcommand, and what got imported.
SCRIPT = r"""
import contextlib, io, json, sys
import glassbox.cli as cli

parser = cli.build_parser()
commands = sorted(next(a for a in parser._actions if a.dest == "command").choices)
helps = {}
for argv in [["--help"], ["--version"]] + [[c, "--help"] for c in commands]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            cli.main(argv)
        except SystemExit as stop:
            code = stop.code
    helps[" ".join(argv)] = [code, out.getvalue()]
print(json.dumps({"commands": commands, "helps": helps, "modules": sorted(sys.modules)}))
"""


def test_every_help_is_answered_without_heavy_imports():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["commands"]) >= {"demo", "parity", "attention", "train", "train-sae", "circuit", "export",
                                       "sweep", "attribute", "evaluate"}
    for argv, (code, text) in report["helps"].items():
        assert code == 0, f"glassbox {argv} exited {code}"
        first = "glassbox " if argv == "--version" else "usage: glassbox"
        assert text.startswith(first), f"glassbox {argv} printed {text[:200]!r}"
    loaded = [m for m in report["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not loaded, f"--help imported {loaded[:10]}"


def test_help_shows_the_librarys_defaults():
    """The values the parsers show without importing the library are the library's own."""
    from glassbox.cli import help_values
    from glassbox.interp.report import DEFAULT_ANSWER, DEFAULT_DISTRACTOR, DEFAULT_PROMPT, PARITY_TOLERANCE
    from glassbox.models.presets import PRESETS
    from glassbox.weights.pretrained import DEFAULT_MODEL

    assert help_values.DEFAULT_MODEL == DEFAULT_MODEL
    assert help_values.PRESET_NAMES == tuple(sorted(PRESETS))
    assert (help_values.DEFAULT_ANSWER, help_values.DEFAULT_DISTRACTOR) == (DEFAULT_ANSWER, DEFAULT_DISTRACTOR)
    assert help_values.DEFAULT_PROMPT == DEFAULT_PROMPT
    import torch
    assert {getattr(torch, name): tol for name, tol in help_values.PARITY_TOLERANCE.items()} == PARITY_TOLERANCE


def test_the_package_still_exports_its_names_lazily():
    code = ("import sys, glassbox\nassert 'torch' not in sys.modules, 'import glassbox imported torch'\n"
            "from glassbox import HookedTransformer, Config, HOOK_SHAPES, HookPoint, HookedRootModule\n"
            "import glassbox.models\nassert glassbox.HookedTransformer is glassbox.models.HookedTransformer\n"
            "assert set(glassbox.__all__) <= set(dir(glassbox))\n"
            "assert glassbox.hooks.HookPoint is HookPoint\n"
            "try:\n    glassbox.HookedTransfomer\nexcept AttributeError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "module 'glassbox' has no attribute 'HookedTransfomer'" in done.stdout
    assert "did you mean 'HookedTransformer'" in done.stdout


def test_the_default_outputs_are_ignored_by_git():
    """Running demo, circuit or attention in a checkout leaves no untracked files for git to show."""
    import shutil
    from pathlib import Path

    import pytest

    from glassbox.cli import build_parser

    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    outputs = {name: sub[name].get_default("out") for name in ("demo", "circuit", "attention")}
    assert outputs == {"demo": "glassbox-report", "circuit": "glassbox-circuit", "attention": "attention.html"}
    paths = ["glassbox-report/index.html", "glassbox-report/summary.json", "glassbox-circuit/graph.json",
             "attention.html"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=root, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == sorted(paths), done.stdout + done.stderr
