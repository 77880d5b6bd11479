"""The circuit-tracer oracle, computed once per session: the fixture folders and every case's graph on
both backends (``dump_graph.py --cases``, one process per backend, the two at once; glassbox.tl takes
the name ``transformer_lens``, so it cannot share a process with the real package)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ct_fixtures import write_model, write_transcoders  # noqa: E402

TEXT = ["Elizabeth read the letter, and Elizabeth read the", "Mr. Darcy walked into the room and"]
INDUCTION = [int(t) for t in torch.randint(1000, 20000, (8,), generator=torch.Generator().manual_seed(7))] * 2
CASES = {  # name: (transcoder kind, prompt, token_ids, dtype)
    "relu-text0": ("relu", TEXT[0], False, "float32"),
    "relu-text1": ("relu", TEXT[1], False, "float32"),
    "relu-induction": ("relu", INDUCTION, True, "float32"),
    "relu-text0-float64": ("relu", TEXT[0], False, "float64"),
    "jumprelu_skip-text0": ("jumprelu_skip", TEXT[0], False, "float32"),
    "jumprelu_skip-induction": ("jumprelu_skip", INDUCTION, True, "float32"),
    "clt-text1": ("clt", TEXT[1], False, "float32"),
    "clt-induction": ("clt", INDUCTION, True, "float32"),
}
FRONTEND_CASE = "relu-text0"
PRUNE = ["0.8,0.98", "0.5,0.9"]
BACKENDS = ("glassbox", "transformer_lens")


def _run_backend(backend: str, cases_file: Path, log: Path) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, str(HERE / "dump_graph.py"), "--cases", str(cases_file), "--backend", backend]
    for pair in PRUNE:
        command += ["--prune", pair]
    with open(log, "w") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900).returncode


@pytest.fixture(scope="session")
def graphs():
    # A folder of our own, not pytest's tmp_path: pytest prunes old basetemp folders of other runs.
    root = Path(tempfile.mkdtemp(prefix="glassbox-ct-"))
    try:
        yield _graphs(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _graphs(root: Path) -> dict:
    model_dir = write_model(root / "model", seed=0)
    folders = {kind: write_transcoders(root / f"tc_{kind}", kind) for kind in ("relu", "jumprelu_skip", "clt")}
    results = {}
    for backend in BACKENDS:
        cases = []
        for name, (kind, prompt, token_ids, dtype) in CASES.items():
            case = dict(model_dir=str(model_dir), transcoder_dir=str(folders[kind]), prompt=prompt,
                        token_ids=token_ids, dtype=dtype, out=str(root / f"{backend}-{name}.pt"))
            if name == FRONTEND_CASE:
                case["frontend"] = str(root / f"frontend-{backend}")
            cases.append(case)
        (root / f"cases-{backend}.json").write_text(json.dumps(cases))
    with ThreadPoolExecutor(2) as pool:
        codes = dict(zip(BACKENDS, pool.map(lambda b: _run_backend(b, root / f"cases-{b}.json", root / f"{b}.log"),
                                            BACKENDS)))
    for backend, code in codes.items():
        assert code == 0, f"dump_graph.py --backend {backend} failed:\n" + (root / f"{backend}.log").read_text()[-6000:]
    for backend in BACKENDS:
        for name in CASES:
            results[backend, name] = torch.load(root / f"{backend}-{name}.pt", weights_only=True)
    return dict(results=results, root=root, model_dir=model_dir)


