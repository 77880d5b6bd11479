"""Run TransformerLens's own test suite, unmodified, on glassbox.tl; write a per-test table and the pass rate.

    python benchmarks/tl_suite/run_tests.py TESTS_DIR --version 2.18 --out OUT [--cache HUB] [-- PYTEST_ARGS]

PYTEST_ARGS that name test files or folders (``tests/acceptance/test_hooks.py``, a ``::`` node id)
run only those; the pass rate is then over them.

TESTS_DIR is TransformerLens's ``tests`` folder of that version (from its sdist or repository). The
runner copies it to OUT/work/tests, puts conftest_template.py above it as OUT/work/conftest.py
(``glassbox.tl.as_transformer_lens()`` before any test module imports ``transformer_lens``;
scope.py's exclusions), builds the stand-in hub cache (hub_cache.py) unless ``--cache`` names one,
and runs pytest in this Python with HF_HUB_OFFLINE=1, HF_HUB_CACHE, HF_DATASETS_OFFLINE=1 and an
empty HF_DATASETS_CACHE beside it, and glassbox from this checkout first on PYTHONPATH. It writes
OUT/results.tsv (node id, outcome, seconds, first line of the failure) and OUT/summary.md.

Pass rate = passed / (passed + failed + errors), over the tests in scope; a test module that fails
to import counts once per test that TransformerLens's own collection finds in it
(``--count-python``, a Python with the real TransformerLens, default /work/main/.tlenv/bin/python
when it exists), else once per test function the file defines (parametrized ones once). Skips that the suite makes itself (no GPU, missing token) are reported
apart and count in neither.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from scope import scope  # noqa: E402


def prepare(tests: Path, work: Path, version: str) -> list:
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(tests, work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    entries = scope(version)
    (work / "scope.json").write_text(json.dumps(entries, indent=1))
    shutil.copy(HERE / "conftest_template.py", work / "conftest.py")
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --continue-on-collection-errors\n"
                                     "pythonpath = .\n"
                                     "filterwarnings =\n    ignore::DeprecationWarning\n")
    return entries


def environment(cache: Path, work: Path, threads: int = 1) -> dict:
    env = dict(os.environ)
    # One thread by default: on a shared 2-core machine torch's default (2) made a small matmul ~1000x
    # slower under load and pushed tests past their time limit.
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HUB_CACHE=str(cache),
               HF_DATASETS_CACHE=str(work.parent / "datasets-cache"), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("HF_TOKEN", None)
    env.pop("GITHUB_ACTIONS", None)
    return env


def tl_counts(python: str, work: Path, env: dict, entries: list) -> tuple:
    """{test file: number of tests in scope}, {test file: number out of scope}, as TransformerLens's own
    installation collects them."""
    plain = work.parent / "collect"
    if plain.exists():
        shutil.rmtree(plain)
    shutil.copytree(work / "tests", plain / "tests")
    (plain / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\npythonpath = .\n")
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "tests"], cwd=plain, env=env,
                         capture_output=True, text=True).stdout
    counts, excluded = collections.Counter(), collections.Counter()
    for line in out.splitlines():
        if "::" in line:  # a test scope.py leaves out is not counted in scope if its module fails to import
            (excluded if out_of_scope(line.strip(), entries) else counts)[line.split("::")[0]] += 1
    return dict(counts), dict(excluded)


def out_of_scope(nodeid: str, entries: list) -> bool:
    return any("::" in e["path"] and (nodeid == e["path"] or nodeid.startswith(e["path"] + "[")
                                      or nodeid.startswith(e["path"] + "::")) for e in entries)


def static_count(path: Path) -> int:
    """The test functions and methods a file defines (parametrized ones counted once): a lower bound
    for a module that neither glassbox.tl nor TransformerLens itself can import here."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return 1
    return max(1, sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
                      for node in ast.walk(tree)))


def parse(junit: Path) -> list:
    rows = []
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        name = case.get("name", "")
        file_part = path
        klass = ""
        # classname is "tests.unit.test_x" or "tests.unit.test_x.TestClass"
        parts = path.split("/")
        if parts and parts[-1][:1].isupper():
            file_part, klass = "/".join(parts[:-1]), parts[-1]
        nodeid = f"{file_part}.py::" + (f"{klass}::" if klass else "") + name
        if not path:  # a module that failed to import: classname "", name "tests.unit.test_x"
            nodeid = name.replace(".", "/") + ".py::"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = found.text or ""
                raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
                first = (found.get("message") or "").strip().splitlines()[:1]
                message = (first[0] if first and first[0] != "collection failure" else
                           (raised[-1] if raised else text.strip()[:300]))[:300]
                break
        if outcome == "skipped" and message.startswith("OUT OF SCOPE"):
            outcome = "excluded"
        rows.append(dict(nodeid=nodeid, outcome=outcome, seconds=float(case.get("time") or 0), message=message))
    return rows


def rows_from_progress(progress: Path) -> list:
    """The rows of a run that did not finish, from the conftest's one line per test phase."""
    rows = {}
    for line in progress.read_text().splitlines():
        nodeid, when, outcome, seconds, message = (line.split("\t") + [""] * 5)[:5]
        row = rows.setdefault(nodeid, dict(nodeid=nodeid, outcome="passed", seconds=0.0, message=""))
        row["seconds"] += float(seconds or 0)
        if outcome == "skipped" and row["outcome"] == "passed":
            row["outcome"] = "excluded" if message.startswith("OUT OF SCOPE") else "skipped"
            row["message"] = message
        elif outcome in ("failed", "error") and row["outcome"] not in ("failed", "error"):
            row["outcome"], row["message"] = outcome, message
    return list(rows.values())


def summarise(rows: list, counts: dict, static_counts: dict, entries: list, version: str, seconds: float,
              excluded: dict = None) -> str:
    weight = []
    tally = collections.Counter()
    for row in rows:  # a module that failed to import stands for the tests TransformerLens collects in it
        n = 1
        if row["outcome"] == "error" and row["nodeid"].endswith(".py::"):
            n = counts.get(row["nodeid"][:-2]) or static_counts.get(row["nodeid"][:-2], 1)
            tally["excluded"] += (excluded or {}).get(row["nodeid"][:-2], 0)
        weight.append(n)
    for row, n in zip(rows, weight):
        tally[row["outcome"]] += n
    scored = tally["passed"] + tally["failed"] + tally["error"]
    rate = tally["passed"] / scored if scored else 0.0
    lines = [f"# TransformerLens {version} tests on glassbox.tl", "",
             f"passed {tally['passed']} / in scope {scored} = {rate:.1%}; failed {tally['failed']}, "
             f"errors {tally['error']}, skipped by the suite {tally['skipped']}, out of scope (skipped) "
             f"{tally['excluded']}, out-of-scope files {sum(1 for e in entries if '::' not in e['path'])}; "
             f"{seconds:.0f} s", "", "## Failures by first line of the message", ""]
    causes = collections.Counter()
    for row, n in zip(rows, weight):
        if row["outcome"] in ("failed", "error"):
            causes[row["message"][:160]] += n
    lines += [f"- {n:4d}  {msg}" for msg, n in causes.most_common()]
    lines += ["", "## Per file (passed / in scope)", ""]
    per = collections.defaultdict(collections.Counter)
    for row, n in zip(rows, weight):
        per[row["nodeid"].split("::")[0]][row["outcome"]] += n
    for path in sorted(per):
        c = per[path]
        lines.append(f"- {path}: {c['passed']} / {c['passed'] + c['failed'] + c['error']}"
                     + (f" ({c['excluded']} out of scope)" if c["excluded"] else ""))
    lines += ["", "## Out of scope", ""] + [f"- {e['path']}: {e['why']}" for e in entries]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", type=Path)
    parser.add_argument("--version", required=True, help="TransformerLens version of TESTS_DIR, e.g. 2.18 or 3.9")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, help="a stand-in hub cache built already (hub_cache.py)")
    parser.add_argument("--count-python", default="/work/main/.tlenv/bin/python")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one test may run")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS / MKL_NUM_THREADS for the tests")
    parser.add_argument("--summarise-only", action="store_true",
                        help="no run: summarise OUT/progress.tsv of a run that was stopped")
    args, extra = parser.parse_known_args(argv)  # what follows "--" goes to pytest (-k, -x, a path)
    args.pytest_args = [a for a in extra if a != "--"]
    if args.summarise_only:
        out = args.out.resolve()
        rows = rows_from_progress(out / "progress.tsv")
        static_counts = {r["nodeid"][:-2]: static_count(out / "work" / r["nodeid"][:-2]) for r in rows
                         if r["nodeid"].endswith(".py::")}
        summary = summarise(rows, {}, static_counts, scope(args.version), args.version, 0.0)
        (out / "summary-partial.md").write_text("(a run stopped before the end: the tests it ran)\n\n" + summary)
        print(summary.split("\n## Per file")[0])
        return 0
    if not (args.tests / "unit").is_dir():
        parser.error(f"{args.tests} is not a TransformerLens tests folder (no unit/ in it)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = (args.cache or out / "hub").resolve()
    if args.cache is None:
        import hub_cache

        hub_cache.build(cache)
    work = out / "work"
    entries = prepare(args.tests.resolve(), work, args.version)
    env = environment(cache, work, args.threads)
    env["GLASSBOX_TL_SUITE_TIMEOUT"] = str(args.timeout)
    env["GLASSBOX_TL_SUITE_PROGRESS"] = str(out / "progress.tsv")  # one line per test as it finishes
    (out / "progress.tsv").write_text("")
    counts, excluded = tl_counts(args.count_python, work, env, entries) if Path(args.count_python).exists() else ({}, {})
    start = time.time()
    junit = out / "junit.xml"
    marker = out / "REAL_TRANSFORMER_LENS_IMPORTED"
    marker.unlink(missing_ok=True)
    # test files or folders among the pytest arguments (tests/...) are the run; else the whole folder
    chosen = [a for a in args.pytest_args if a.split("::")[0].startswith("tests/")]
    paths = [] if chosen else ["tests"]
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-rN", f"--junitxml={junit}", *paths,
                    *args.pytest_args], cwd=work, env=env)
    if marker.exists():
        sys.exit(f"the real TransformerLens was imported during the run, so it did not test glassbox.tl: "
                 f"{marker.read_text().strip()}")
    seconds = time.time() - start
    rows = parse(junit)
    with open(out / "results.tsv", "w") as table:
        table.write("nodeid\toutcome\tseconds\tmessage\n")
        for row in rows:
            table.write(f"{row['nodeid']}\t{row['outcome']}\t{row['seconds']:.2f}\t{row['message']}\n")
    static_counts = {row["nodeid"][:-2]: static_count(work / row["nodeid"][:-2]) for row in rows
                     if row["nodeid"].endswith(".py::")}
    summary = summarise(rows, counts, static_counts, entries, args.version, seconds, excluded)
    (out / "summary.md").write_text(summary)
    print(summary.split("\n## Per file")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
