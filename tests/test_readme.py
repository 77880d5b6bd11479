"""The README is the landing page: its set-up commands are exactly CI's, its links point at pages and
sections that exist, and the calls it names are shown with their real signatures.

Its Python blocks each run on their own, with every block of the documentation site
(``tests/test_docs.py``, which also checks what the TransformerLens block of
``docs/transformer-lens.md`` prints).
"""

import ast
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEST_COMMAND = "pip install torch==2.13.0 && pip install -e '.[test,scale,docs]' && python -m pytest -q"


def test_readme_set_up_commands_match_ci():
    text = README.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert TEST_COMMAND in text and TEST_COMMAND in ci
    assert "pip install torch==2.13.0 && pip install -e . && glassbox demo" in text
    assert TEST_COMMAND in (ROOT / "docs" / "getting-started.md").read_text()


def slug(heading: str) -> str:
    """The anchor MkDocs' toc gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def test_readme_links_resolve_to_pages_and_sections():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert len(local) >= 15, local  # the landing page links into every area of the docs
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"README links to {link}: no such section"
    for page in ("getting-started", "models", "hooks", "cache", "patching", "saes", "attribution",
                 "scaling-out", "transformer-lens", "reliability", "performance"):
        assert f"docs/{page}.md" in local, page


def shown_signature(text: str, name: str) -> list:
    """The parameters (name, default source or None) of ``# name(...)`` as the README's comment shows it."""
    m = re.search(r"#\s*" + name + r"\((.*?)\)\s*->", text, flags=re.S)
    assert m, f"the README does not show {name}'s signature"
    shown = re.sub(r"\s*\n\s*#\s*", " ", m.group(1))
    params = []
    for part in re.split(r",\s*(?![^()]*\))", shown):
        part = part.strip()
        if part in ("*", "..."):
            continue
        key, _, default = part.partition("=")
        params.append((key.strip(), default.strip() or None))
    return params


def test_readme_shows_top_features_and_feature_ablate_with_their_real_signatures():
    from glassbox.interp.sae import feature_ablate, top_features

    text = README.read_text()
    assert "with model.saes([sae]" in text
    for fn in (top_features, feature_ablate):
        real = inspect.signature(fn).parameters
        for key, default in shown_signature(text, fn.__name__):
            assert key in real, f"the README shows {fn.__name__}({key}), which it does not take"
            if default is not None and "|" not in default:
                assert ast.literal_eval(default) == real[key].default, (fn.__name__, key, default)
        shown = [k for k, _ in shown_signature(text, fn.__name__)]
        positional = [k for k, p in real.items() if p.default is inspect.Parameter.empty]
        assert shown[:len(positional)] == positional, (fn.__name__, shown, positional)

