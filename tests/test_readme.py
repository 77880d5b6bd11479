"""The README's Python examples run as written (offline, on the shipped model)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert (tmp_path / "resid_pre.html").is_file()
    assert namespace["result"].axes == ("layer", "pos")


def test_readme_set_up_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    test_command = "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q"
    assert test_command in text and test_command in ci
    assert "pip install torch==2.13.0 && pip install -e . && glassbox demo" in text
