"""The README's Python examples run as written (offline, on the shipped model)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        if "as_transformer_lens()" in block:
            continue  # changes sys.modules for the whole process: run in its own (next test)
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "resid_pre.html").is_file()
    assert namespace["result"].axes == ("layer", "pos")


def test_readme_transformer_lens_block_runs_in_its_own_process(tmp_path):
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
              if "as_transformer_lens()" in b]
    assert len(blocks) == 1
    done = subprocess.run([sys.executable, "-c", blocks[0] + "\nprint('shape', tuple(stack.shape))"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Rank: 0" in done.stdout and "shape (6, 1, 192)" in done.stdout  # 2 layers x 3 heads, d_model 192


def test_readme_set_up_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = "pip install torch==2.13.0 && pip install -e '.[test,scale]' && python -m pytest -q"
    assert test_command in text and test_command in ci
    assert "pip install torch==2.13.0 && pip install -e . && glassbox demo" in text
