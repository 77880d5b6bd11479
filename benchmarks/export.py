"""Export throughput: glassbox in-process vs glassbox on 2 local Ray workers vs SAELens's CacheActivationsRunner.

```
python benchmarks/export.py                       # 3 rounds, glassbox-austen, 2 hooks, context 128 (~5 min here)
python benchmarks/export.py --rounds 2 --out /tmp/results-export.json
```

The same pretokenized rows go to all three: ``tests_tl/data/austen_tail.txt`` cut by glassbox's
``text_windows`` (a BOS and 127 stream tokens per window), truncated to whole shards, saved once as a
``datasets`` folder. Each turn is a fresh subprocess with one torch thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``):

- ``in-process``: ``glassbox.scale.export(..., dataset=rows, backend="local")``.
- ``ray-2``: the same with ``backend="ray", n_workers=2``: a new local Ray cluster of 2 CPUs, one actor per
  CPU, each actor's torch thread count set to 1 by the backend (``cpus_per_worker=1``; Ray also sets
  ``OMP_NUM_THREADS=1`` in its workers). "total" includes starting and stopping the cluster, the actors'
  interpreter starts and model loads; "steady" is the sum over the two actors of each actor's tokens /
  the sum of its shards' wall times (from the manifest: ``run_shard`` alone, per shard).
- ``saelens``: SAELens's ``CacheActivationsRunner`` (unshuffled, float32, ``prepend_bos=False``, buffers
  of one glassbox shard) on TransformerLens 3.9 holding glassbox-austen's weights (``tl_oracle.tl_twin``;
  the runner loads models by name only, so its module's ``load_model`` is replaced by one returning the
  twin), run with the SAELens environment's interpreter. The runner caches ONE hook per run, so the two
  hooks take two runs (each stopping at its own layer, as SAELens does); its time is the sum. The twin is
  built once and counted once.

"total" is the export call (model load, the export, consolidation) timed inside the subprocess, after
its imports (torch, datasets, ray, sae_lens); "process" is the whole subprocess, interpreter start and imports
included; "steady" for in-process is the tokens over the sum of the shards' wall times, for SAELens
its ``run()`` calls (the runner's model and store are built before). Peers run interleaved, the order
rotated each round; ratios vs in-process are taken within each round and their median reported. Before
timing counts, the first round's outputs are compared: Ray's must equal in-process's bit for bit,
SAELens's token ids equal and activations within float rounding (else the run stops).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("in-process", "ray-2", "saelens")
HOOKS = "blocks.0.hook_resid_post,blocks.1.hook_resid_post"
TL_PYTHON = "/opt/tlenv/bin/python"
SAELENS_REL_TOL = 1e-5  # max |diff| / max |activation|; measured 6.7e-7 here (4.2e-5 on values up to 62)


def _emit(record: dict) -> None:
    print("RESULT " + json.dumps(record), flush=True)


def worker_glassbox(args) -> None:
    began = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    import datasets  # noqa: F401  imported before timing, as for SAELens
    from glassbox.scale import export, load_manifest

    on_ray = args.worker == "ray-2"
    if on_ray:
        import ray  # noqa: F401  imported before timing; starting the cluster is timed

    imported = time.perf_counter()
    out = export(args.model, args.out_dir, args.hooks.split(","), dataset=args.tokens, batch_size=args.batch_size,
                 shard_size=args.shard_size, backend="ray" if on_ray else "local", n_workers=2 if on_ray else None,
                 progress=False)
    done = time.perf_counter()
    shards = [{"index": int(k), "tokens": v["token_stop"] - v["token_start"], "wall_s": v["wall_s"],
               "worker": v["worker"], "torch_threads": v["torch_threads"]}
              for k, v in load_manifest(out)["shards"].items()]
    _emit({"peer": args.worker, "import_s": imported - began, "total_s": done - imported, "shards": shards})


def worker_saelens(args) -> None:
    began = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests_tl"))
    from datasets import load_from_disk
    from sae_lens import CacheActivationsRunner, CacheActivationsRunnerConfig
    import sae_lens.cache_activations_runner as runner_module
    from glassbox.weights import from_pretrained
    from tl_oracle import tl_twin

    imported = time.perf_counter()
    twin = tl_twin(from_pretrained(args.model))
    runner_module.load_model = lambda **kwargs: twin
    d_in = twin.cfg.d_model
    rows = load_from_disk(args.tokens)
    n_tokens, ctx = len(rows) * args.context_size, args.context_size
    buffer_tokens = args.shard_size * ctx  # one SAELens buffer (an arrow file) per glassbox shard
    runs = []
    for hook in args.hooks.split(","):
        cfg = CacheActivationsRunnerConfig(
            dataset_path="local tokens", model_name="glassbox-austen", model_batch_size=args.batch_size,
            hook_name=hook, d_in=d_in, training_tokens=n_tokens, context_size=ctx,
            new_cached_activations_path=str(Path(args.out_dir) / hook), shuffle=False, dtype="float32",
            device="cpu", streaming=False, prepend_bos=False, buffer_size_gb=(buffer_tokens * d_in * 4 + 0.5) / 1e9)
        runner = CacheActivationsRunner(cfg, override_dataset=rows)
        started = time.perf_counter()
        runner.run()
        runs.append({"hook": hook, "run_s": time.perf_counter() - started})
    done = time.perf_counter()
    _emit({"peer": "saelens", "import_s": imported - began, "total_s": done - imported, "runs": runs,
           "tokens": n_tokens})


def prepare(args, work: Path) -> int:
    """Tokenize the text once into a ``datasets`` folder of whole shards; returns the windows kept."""
    from datasets import Dataset

    from glassbox.scale import text_windows
    from glassbox.scale.export import model_tokenizer

    windows = text_windows(args.text, model_tokenizer(args.model), args.context_size)
    keep = len(windows) // args.shard_size * args.shard_size
    if args.max_windows:
        keep = min(keep, args.max_windows // args.shard_size * args.shard_size)
    if keep < 2 * args.shard_size:
        raise ValueError(f"{args.text}: {len(windows)} windows of {args.context_size} tokens make fewer than two "
                         f"shards of {args.shard_size}")
    Dataset.from_dict({"tokens": windows.rows(0, keep).tolist()}).save_to_disk(str(work / "tokens"))
    return keep


def run_turn(args, peer: str, work: Path, out_dir: Path) -> dict:
    python = args.tl_python if peer == "saelens" else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", peer, "--model", args.model, "--hooks", args.hooks,
           "--tokens", str(work / "tokens"), "--out-dir", str(out_dir), "--batch-size", str(args.batch_size),
           "--shard-size", str(args.shard_size), "--context-size", str(args.context_size)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               RAY_DISABLE_USAGE_STATS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True)
    wall = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{peer} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    record = json.loads(lines[-1][len("RESULT "):])
    record["process_s"] = wall
    return summarise(record)


def summarise(record: dict) -> dict:
    """Add tokens, total tokens/s and steady tokens/s to a turn's record."""
    if record["peer"] == "saelens":
        tokens = record["tokens"]
        record["steady_tps"] = tokens / sum(r["run_s"] for r in record["runs"])
    else:
        tokens = sum(s["tokens"] for s in record["shards"])
        per_worker = {}
        for shard in record["shards"]:
            t, w = per_worker.get(shard["worker"], (0, 0.0))
            per_worker[shard["worker"]] = (t + shard["tokens"], w + shard["wall_s"])
        record["workers"] = len(per_worker)
        record["steady_tps"] = sum(t / w for t, w in per_worker.values())
        record["threads"] = sorted({s["torch_threads"] for s in record["shards"]})
    record["tokens"] = tokens
    record["total_tps"] = tokens / record["total_s"]
    return record


def check_agreement(outs: dict, hooks) -> dict:
    """Ray's export equals in-process's bit for bit; SAELens's has the same token ids, activations close."""
    import torch
    from datasets import load_from_disk

    local = load_from_disk(str(outs["in-process"])).with_format("torch")[:]
    ray = load_from_disk(str(outs["ray-2"])).with_format("torch")[:]
    for column in list(hooks) + ["token_ids"]:
        if not torch.equal(local[column], ray[column]):
            raise AssertionError(f"the Ray export's {column} differs from the in-process export's")
    diffs = {}
    for hook in hooks:
        theirs = load_from_disk(str(outs["saelens"] / hook)).with_format("torch")[:]
        if not torch.equal(theirs["token_ids"], local["token_ids"]):
            raise AssertionError(f"SAELens's token_ids ({hook} run) differ from glassbox's")
        diff = float((theirs[hook].double() - local[hook].double()).abs().max())
        scale = float(local[hook].abs().max())
        if not diff < SAELENS_REL_TOL * scale:
            raise AssertionError(f"SAELens's {hook} differs from glassbox's by {diff:.3g} (values up to {scale:.3g})")
        diffs[hook] = {"max_abs_diff": diff, "max_abs": scale}
    return diffs


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def table(rounds: list) -> str:
    rows = ["| path | process s | total s | tokens/s, total | tokens/s, steady | total vs in-process | "
            "steady vs in-process |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for peer in PEERS:
        turns = [r[peer] for r in rounds]
        ratio_total = statistics.median(r[peer]["total_tps"] / r["in-process"]["total_tps"] for r in rounds)
        ratio_steady = statistics.median(r[peer]["steady_tps"] / r["in-process"]["steady_tps"] for r in rounds)
        rows.append(f"| {peer} | {statistics.median(t['process_s'] for t in turns):.1f} | "
                    f"{statistics.median(t['total_s'] for t in turns):.1f} | "
                    f"{statistics.median(t['total_tps'] for t in turns):,.0f} | "
                    f"{statistics.median(t['steady_tps'] for t in turns):,.0f} | {ratio_total:.2f}x | "
                    f"{ratio_steady:.2f}x |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="glassbox-austen")
    parser.add_argument("--hooks", default=HOOKS)
    parser.add_argument("--text", default=str(ROOT / "tests_tl" / "data" / "austen_tail.txt"))
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shard-size", type=int, default=64)
    parser.add_argument("--max-windows", type=int, default=0, help="at most this many windows (0: all whole shards)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tl-python", default=TL_PYTHON, help="the interpreter with SAELens")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results-export.json"))
    parser.add_argument("--worker", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        (worker_saelens if args.worker == "saelens" else worker_glassbox)(args)
        return
    if not Path(args.tl_python).is_file():
        raise SystemExit(f"no SAELens interpreter at {args.tl_python} (--tl-python)")
    hooks = args.hooks.split(",")
    began = time.time()
    work = Path(tempfile.mkdtemp(prefix="glassbox_export_bench_"))
    try:
        windows = prepare(args, work)
        print(f"{windows} windows x {args.context_size} = {windows * args.context_size:,} tokens; hooks {hooks}; "
              f"load {_load()}", flush=True)
        rounds, agreement = [], None
        for i in range(args.rounds):
            order = PEERS[i % 3:] + PEERS[:i % 3]
            outs, result = {}, {"order": list(order), "load_before": _load()}
            for peer in order:
                outs[peer] = work / f"out_{i}_{peer}"
                result[peer] = run_turn(args, peer, work, outs[peer])
                turn = result[peer]
                print(f"round {i + 1} {peer:10s} total {turn['total_s']:6.1f} s  {turn['total_tps']:8,.0f} tok/s  "
                      f"steady {turn['steady_tps']:8,.0f} tok/s  (process {turn['process_s']:.1f} s, "
                      f"load {_load()})", flush=True)
            if agreement is None:
                agreement = check_agreement(outs, hooks)
                print(f"agreement: Ray == in-process bit for bit; SAELens {agreement}", flush=True)
            for out in outs.values():
                shutil.rmtree(out, ignore_errors=True)
            rounds.append(result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = table(rounds)
    print(text)
    record = {"machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                          "processor": platform.processor() or platform.machine(), "load_after": _load()},
              "args": {k: v for k, v in vars(args).items() if k not in ("worker", "tokens", "out_dir")},
              "windows": windows, "tokens": windows * args.context_size, "minutes": (time.time() - began) / 60,
              "agreement": agreement, "rounds": rounds, "table": text}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['minutes']:.1f} minutes; wrote {args.out}")


if __name__ == "__main__":
    main()
