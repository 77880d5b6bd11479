"""The documentation site builds with warnings as errors, and every Python block on it runs on its own.

- The site (``mkdocs.yml``, pages under ``docs/``, the API reference from the docstrings, the
  tutorials) is built with ``mkdocs build --strict`` into a temporary folder; the same configuration
  with a broken link, a broken anchor or a missing API object must fail, so "strict" is proven to
  catch them.
- Every ```` ```python ```` block of ``README.md`` and of the site's pages runs alone, in a fresh
  namespace with a temporary working folder (so a block that uses a model must load it). The one block
  that calls ``glassbox.tl.as_transformer_lens()`` (it replaces ``transformer_lens`` in
  ``sys.modules``) runs in a subprocess. A block that is deliberately partial is marked by the
  comment ``<!-- not run: REASON -->`` on the line before its fence; at most ``MAX_NOT_RUN`` such
  blocks exist. Shell commands are ``bash`` blocks and are not run.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MAX_NOT_RUN = 3
BLOCK = re.compile(r"(?:^(<!-- not run: (?P<why>.+?) -->)\n)?^```python\n(?P<code>.*?)^```", re.S | re.M)


def needs_docs_extra():
    try:
        import mkdocs  # noqa: F401
        import mkdocs_jupyter  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as err:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI is set but the docs extra is missing ({err}): pip install -e '.[docs]'")
        pytest.skip(f"the site needs the docs extra (pip install -e '.[docs]'): {err}")


def build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_the_site_builds_strict_with_every_page(tmp_path):
    needs_docs_extra()
    done = build(ROOT / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("getting-started", "models", "hooks", "cache", "patching", "saes", "attribution",
                 "attribution-graphs", "scaling-out", "scaling", "transformer-lens", "reliability", "performance",
                 "tutorials/01_parity_and_attention", "tutorials/04_circuits_attribution", "api/models"):
        assert (site / page / "index.html").is_file(), page
    api = (site / "api" / "models" / "index.html").read_text()
    assert "run_with_cache" in api and "from_pretrained" in api  # the reference holds the docstrings
    tour = (site / "tutorials" / "01_parity_and_attention" / "index.html").read_text()
    assert "parity_report" in tour  # the notebook is rendered
    for page in site.rglob("*.html"):  # the built site loads nothing from the network
        remote = re.findall(r'<(?:script|link)[^>]*(?:src|href)="(https?://[^"]*)"', page.read_text())
        assert not remote, (page, remote)


@pytest.mark.parametrize("broken,named", [
    ("[a missing page](no-such-page.md)", "no-such-page.md"),
    ("[a missing anchor](models.md#no-such-section)", "no-such-section"),
    ("::: glassbox.models.no_such_module", "no_such_module"),
])
def test_strict_build_fails_on_a_broken_reference(tmp_path, broken, named):
    """The same configuration over a copy of the pages plus one broken reference fails to build."""
    needs_docs_extra()
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "models.md").write_text((DOCS / "models.md").read_text())
    (docs / "index.md").write_text(f"# Home\n\nSee [the models](models.md).\n\n{broken}\n")
    config.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"Models": "models.md"}])
    config["plugins"] = [p for p in config["plugins"] if not (isinstance(p, dict) and "mkdocs-jupyter" in p)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert done.returncode != 0, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert named in output, output[-2000:]  # the failure names what is broken
    clean = build_clean_copy(tmp_path, config, docs)
    assert clean.returncode == 0, clean.stderr[-2000:]  # the same copy without the broken line builds


def build_clean_copy(tmp_path: Path, config: dict, docs: Path) -> subprocess.CompletedProcess:
    (docs / "index.md").write_text("# Home\n\nSee [the models](models.md).\n")
    return build(tmp_path / "mkdocs.yml", tmp_path / "site2", tmp_path)


def code_blocks() -> list:
    """(file, line, code, reason-or-None) of every python block of the README and the site's pages."""
    found = []
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        text = path.read_text()
        for m in BLOCK.finditer(text):
            found.append((path.relative_to(ROOT).as_posix(), text[:m.start("code")].count("\n") + 1,
                          m.group("code"), m.group("why")))
    return found


BLOCKS = code_blocks()


def test_few_blocks_are_marked_not_run():
    marked = [(f, line, why) for f, line, _, why in BLOCKS if why is not None]
    assert len(marked) <= MAX_NOT_RUN, marked
    assert all(why.strip() for _, _, why in marked), marked
    # a marker that is not right above a python fence is a typo that would run nothing silently
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for m in re.finditer(r"<!-- not run:.*?-->\n(.*)", path.read_text()):
            assert m.group(1) == "```python", (path, m.group(0))


@pytest.mark.parametrize("where,line,code,why", BLOCKS, ids=[f"{f}:{line}" for f, line, _, _ in BLOCKS])
def test_code_block_runs_on_its_own(tmp_path, monkeypatch, where, line, code, why):
    if why is not None:
        pytest.skip(f"marked not run: {why}")
    if "as_transformer_lens()" in code:  # replaces transformer_lens in sys.modules: a process of its own
        done = subprocess.run([sys.executable, "-c", code + "\nprint('shape', tuple(stack.shape))"],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, f"{where}:{line}\n{done.stderr[-3000:]}"
        # test_prompt's report, and the stack of 2 layers x 3 heads of d_model 192
        assert "Rank: 0" in done.stdout and "shape (6, 1, 192)" in done.stdout, done.stdout[-2000:]
        return
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{where}:{line}", "exec"), {"__name__": "__docs_block__"})


def test_help_text_and_package_metadata_name_the_families():
    import configparser

    meta = configparser.ConfigParser()
    meta.read(ROOT / "setup.cfg")
    description = meta["metadata"]["description"]
    assert "GPT-2" in description and "Llama" in description and "transformer language models" in description
    from glassbox.cli import build_parser

    text = build_parser().format_help()
    assert "GPT-2" in text and "Llama" in text and "OLMo 2" in text, text
    assert "tested GPT-2 for" not in text
