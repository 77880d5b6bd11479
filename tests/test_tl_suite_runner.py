"""benchmarks/tl_suite's runner on a tiny stand-in of TransformerLens's tests folder: the bridge stand-in
skips (and counts out of scope) what uses TransformerBridge while the rest of the file runs on
glassbox.tl, a ``-- tests/...`` subset runs only that subset, and a run that imports a real
``transformer_lens`` package stops with an error naming it instead of writing a summary."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parents[1] / "benchmarks" / "tl_suite" / "run_tests.py"

MIXED = '''
import pytest
from transformer_lens import HookedTransformer
from transformer_lens.config import TransformerBridgeConfig
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.generalized_components import BlockBridge


class MockBlock(BlockBridge):  # a bridge mock defined at import time
    pass


@pytest.fixture
def bridge():
    return TransformerBridge.boot_transformers("gpt2")


def test_bridge(bridge):
    raise AssertionError("a bridge test ran")


def test_bridge_config():
    TransformerBridgeConfig(d_model=3)


def test_mock_block():
    MockBlock()


def test_hooked():
    assert HookedTransformer.__module__.startswith("glassbox.tl")
'''

IMPORTS_REAL = '''
def test_imports_real_package():
    import importlib.machinery, importlib.util, sys
    spec = importlib.machinery.PathFinder.find_spec("transformer_lens")
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_tl"] = module
    spec.loader.exec_module(module)
'''


def _suite(tmp_path: Path, files: dict) -> Path:
    tests = tmp_path / "tl" / "tests"
    (tests / "unit").mkdir(parents=True)
    for name, text in {"__init__.py": "", "unit/__init__.py": "", **files}.items():
        (tests / name).write_text(text)
    return tests


def _run(tmp_path: Path, tests: Path, *extra: str, real_tl: bool = False):
    env = dict(os.environ)
    if real_tl:  # a package named transformer_lens on sys.path, as a real installation would be
        site = tmp_path / "site"
        (site / "transformer_lens").mkdir(parents=True)
        (site / "transformer_lens" / "__init__.py").write_text("REAL = True\n")
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    (tmp_path / "hub").mkdir(exist_ok=True)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(RUNNER), str(tests), "--version", "3.9", "--out", str(out),
                           "--cache", str(tmp_path / "hub"), "--count-python", str(tmp_path / "no-python"),
                           *extra], env=env, capture_output=True, text=True, timeout=600)
    return done, out


def _outcomes(out: Path) -> dict:
    rows = [line.split("\t") for line in (out / "results.tsv").read_text().splitlines()[1:]]
    return {row[0].split("::")[-1]: (row[1], row[3]) for row in rows}


def test_bridge_uses_are_out_of_scope_and_the_rest_runs(tmp_path):
    tests = _suite(tmp_path, {"unit/test_mixed.py": MIXED, "unit/test_other.py": "def test_other():\n    pass\n"})
    done, out = _run(tmp_path, tests, "--", "tests/unit/test_mixed.py")
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = _outcomes(out)
    assert set(outcomes) == {"test_bridge", "test_bridge_config", "test_mock_block", "test_hooked"}  # subset only
    assert outcomes["test_hooked"][0] == "passed"
    for name, what in [("test_bridge", "TransformerBridge.boot_transformers"),
                       ("test_bridge_config", "TransformerBridgeConfig"), ("test_mock_block", "MockBlock")]:
        assert outcomes[name][0] == "excluded", outcomes[name]
        assert outcomes[name][1].startswith("OUT OF SCOPE: TransformerBridge") and what in outcomes[name][1]
    assert "passed 1 / in scope 1 = 100.0%" in (out / "summary.md").read_text()


@pytest.mark.parametrize("real_tl", [False, True])
def test_a_run_that_imports_the_real_transformer_lens_fails(tmp_path, real_tl):
    tests = _suite(tmp_path, {"unit/test_real.py": IMPORTS_REAL if real_tl else "def test_x():\n    pass\n"})
    done, out = _run(tmp_path, tests, real_tl=real_tl)
    if not real_tl:
        assert done.returncode == 0 and (out / "summary.md").exists(), done.stderr[-2000:]
        return
    assert done.returncode != 0
    assert "the real TransformerLens was imported" in done.stderr and "real_tl" in done.stderr, done.stderr[-2000:]
    assert str(tmp_path / "site" / "transformer_lens") in done.stderr
    assert not (out / "summary.md").exists()
