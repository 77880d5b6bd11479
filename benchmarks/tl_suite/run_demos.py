"""Run TransformerLens's demo notebooks, unmodified, on glassbox.tl; a per-cell pass/fail and time table.

    python benchmarks/tl_suite/run_demos.py NOTEBOOK.ipynb ... --out OUT [--cache HUB] [--threads N]
    /work/main/.tlenv/bin/python benchmarks/tl_suite/run_demos.py ... --transformer-lens   # the oracle side

Each notebook runs top to bottom in a fresh IPython kernel (nbclient, a docs/test-only dependency),
every cell even after one fails (``allow_errors``), so the table shows which cells pass on their own
inputs. The kernel gets, before the first cell and without an edit to the notebook:
  - ``glassbox.tl.as_transformer_lens()``, from an IPython startup file in a private IPYTHONDIR;
  - glassbox from this checkout first on PYTHONPATH, then standins/: offline stand-ins for
    ``circuitsvis`` (its views need JavaScript from the web; the stand-in checks the pattern's shape
    and returns a placeholder) and ``neel_plotly`` (installed from a git repository by the demo;
    the stand-in plots with plotly.express);
  - HF_HUB_OFFLINE=1 and HF_HUB_CACHE = the stand-in hub cache (hub_cache.py): seeded random weights,
    so numbers and generated text are not the real models'.
Cells that ``%pip install`` run only under Colab (``IN_COLAB``), which is False here. Plotly draws with
the renderer the notebook chooses ("colab": HTML that loads plotly.js from the web only when viewed).
GITHUB_ACTIONS is left unset, so cells TransformerLens's CI skips (``if not IN_GITHUB``) do run.
``--transformer-lens`` runs the same notebooks on TransformerLens itself, for a benchmark against it:
no ``as_transformer_lens()`` and this checkout not on PYTHONPATH (the stand-ins and the hub cache stay);
run the runner with the Python that has TransformerLens installed (the kernel is that interpreter).
``--threads N`` sets OMP_NUM_THREADS and MKL_NUM_THREADS in the kernel (torch's thread count); give both
sides of a benchmark the same N.
Writes OUT/<notebook>.tsv (cell, outcome, seconds, first line of the error or the cell), OUT/demos.md.
"""

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def kernel_environment(cache: Path, out: Path, transformer_lens: bool = False, threads=None) -> dict:
    ipython_dir = out / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    start_file = startup / "00-glassbox-tl.py"
    if transformer_lens:
        start_file.unlink(missing_ok=True)  # an OUT used before for glassbox.tl
    else:
        start_file.write_text("import glassbox.tl\nglassbox.tl.as_transformer_lens()\n")
    env = dict(os.environ)
    first = [str(HERE / "standins")] if transformer_lens else [str(REPO), str(HERE / "standins")]
    env.update(IPYTHONDIR=str(ipython_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HUB_CACHE=str(cache), HF_DATASETS_CACHE=str(out / "datasets-cache"),
               PYTHONPATH=os.pathsep.join(first + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                   if p and (not transformer_lens or Path(p).resolve() != REPO)]))
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    for name in ("GITHUB_ACTIONS", "HF_TOKEN"):
        env.pop(name, None)
    return env


def first_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:200].replace("\t", " ")


def run_notebook(path: Path, env: dict, timeout: int) -> list:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    rows = []
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                start = time.time()
                try:
                    client.execute_cell(cell, index)
                    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                    outcome = "failed" if errors else "passed"
                    message = f"{errors[0]['ename']}: {first_line(errors[0]['evalue'])}" if errors else ""
                except Exception as err:  # a cell that ran past the timeout, or a dead kernel
                    outcome, message = "failed", f"{type(err).__name__}: {first_line(err)}"
                rows.append(dict(cell=index, outcome=outcome, seconds=time.time() - start, message=message,
                                 source=first_line(cell.source)))
                print(f"{path.name} cell {index}: {outcome} {rows[-1]['seconds']:.1f}s {message}", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, help="a stand-in hub cache built already (hub_cache.py)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one cell may run")
    parser.add_argument("--transformer-lens", action="store_true",
                        help="run on TransformerLens itself (no as_transformer_lens(); this checkout not on PYTHONPATH)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS / MKL_NUM_THREADS in the kernel")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = (args.cache or out / "hub").resolve()
    if args.cache is None:
        sys.path.insert(0, str(HERE))
        import hub_cache

        hub_cache.build(cache)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    env = kernel_environment(cache, out, args.transformer_lens, args.threads)
    side = "TransformerLens itself" if args.transformer_lens else "glassbox.tl"
    report = [f"# TransformerLens demos on {side}", "",
              f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    for path in args.notebooks:
        start = time.time()
        rows = run_notebook(path.resolve(), env, args.timeout)
        minutes = (time.time() - start) / 60
        with open(out / f"{path.stem}.tsv", "w") as table:
            table.write("cell\toutcome\tseconds\tmessage\tsource\n")
            for r in rows:
                table.write(f"{r['cell']}\t{r['outcome']}\t{r['seconds']:.1f}\t{r['message']}\t{r['source']}\n")
        passed = sum(r["outcome"] == "passed" for r in rows)
        report.append(f"## {path.name}: {passed} / {len(rows)} code cells passed, {minutes:.1f} min "
                      f"({minutes * 60:.0f} s; load average after: {os.getloadavg()[0]:.2f})")
        report += [f"- cell {r['cell']} ({r['seconds']:.0f} s) `{r['source']}`: {r['message']}" for r in rows
                   if r["outcome"] != "passed"]
        report.append("")
    (out / "demos.md").write_text("\n".join(report) + "\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
