"""Benchmarks: glassbox vs ``transformers`` vs TransformerLens on one seeded random GPT-2.

    python benchmarks/run.py [--quick] [--threads N] [--out results.json]

Builds a random GPT-2 (the GPT-2-small shape by default), gives all peers the same weights, checks
that they compute the same numbers, and times them interleaved (see timing.py): plain forward,
run_with_cache (every hook; only patterns), run_with_hooks with a no-op hook everywhere, the
resid_pre activation-patching sweep, loading from a folder, and the peak RSS of a full cache in a
subprocess. Prints a table and writes JSON. TransformerLens is optional: install it to compare (see
benchmarks/README.md); without it its columns read "-". TransformerLens 4 and nnsight run as workers in
their own environments (peers.REMOTE, peer_worker.py) for forward, both caches and the sweep; absent
ones are named. Not a test: nothing here runs in the suite.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

# TransformerLens's sweep draws a progress bar; tqdm reads this when first imported (torch imports it).
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cases  # noqa: E402
import memory  # noqa: E402
import sweep  # noqa: E402
from peers import REMOTE, build_peers, start_remote  # noqa: E402

SHAPES = [(1, 16), (1, 128), (8, 128), (1, 1024)]
FULL = dict(rounds=7, forward=SHAPES, cache=SHAPES, patterns=[(1, 128), (8, 128)], noop=[(1, 128), (8, 128)],
            sweep_rounds=5, load_rounds=5, memory=[(8, 1024), (4, 1024)])
QUICK = dict(rounds=3, forward=[(1, 16), (1, 128)], cache=[(1, 16)], patterns=[(1, 16)], noop=[(1, 16)],
             sweep_rounds=2, load_rounds=2, memory=[(2, 256)])
PEERS = ("glassbox", "transformers", "TransformerLens")


def machine(threads: int) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import transformers

    from peers import tl_available

    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": threads, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "transformer_lens": tl_available()[0], "platform": platform.platform()}


def paired(result: dict, numerator: str, denominator: str):
    """Median over rounds of time[numerator] / time[denominator]; None if either is absent."""
    peers = result.get("peers", {})
    if numerator not in peers or denominator not in peers:
        return None
    return statistics.median(a / b for a, b in zip(peers[numerator]["times_s"], peers[denominator]["times_s"]))


def table(results: list) -> str:
    head = f"{'case':<38} {'shape':>8} {'glassbox':>9} {'transf.':>9} {'TL':>9} {'gb/tf':>6} {'TL/tf':>6} {'TL/gb':>6}" + "".join(
        f" {'TL4':>9} {'TL4/tf':>6}" if n.startswith("TL4") else f" {n[:9]:>9} {n[:3] + '/tf':>6}" for n in REMOTE)
    lines = [head, "-" * len(head)]
    for r in results:
        if "skipped" in r:
            lines.append(f"{r['case']:<38} {r['shape']:>8}  skipped: {r['skipped']}")
            continue
        peers = r["peers"]
        secs = [f"{peers[p]['median_s']:9.4f}" if p in peers else f"{'-':>9}" for p in PEERS]
        ratios = [paired(r, "glassbox", "transformers"), paired(r, "TransformerLens", "transformers"),
                  paired(r, "TransformerLens", "glassbox")]
        ratio_text = [f"{x:6.2f}" if x is not None else f"{'-':>6}" for x in ratios]
        remote = [f"{peers[n]['median_s']:9.4f} {paired(r, n, 'transformers'):6.2f}" if n in peers else f"{'-':>9} {'-':>6}"
                  for n in REMOTE]
        lines.append(f"{r['case']:<38} {r['shape']:>8} {' '.join(secs)} {' '.join(ratio_text)} {' '.join(remote)}")
    return "\n".join(lines)


def memory_table(rows: list) -> str:
    lines = []
    for m in rows:
        if "peak_rss_bytes" not in m:
            lines.append(f"peak RSS, full cache {m['shape']}, {m['peer']}: {m.get('skipped') or m.get('failed')}")
            continue
        predicted = m["predicted_cache_bytes"]
        pred = f", cache_size predicted {predicted / 2**30:.3f} GiB ({(predicted / m['cache_bytes'] - 1) * 100:+.2f}%)" \
            if predicted else ""
        lines.append(f"peak RSS, full cache {m['shape']}, {m['peer']}: {m['peak_rss_bytes'] / 2**30:.2f} GiB = "
                     f"{m['peak_over_weights_plus_cache']:.3f} x (weights {m['weights_bytes'] / 2**30:.2f} GiB + "
                     f"cache {m['cache_bytes'] / 2**30:.2f} GiB){pred}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="glassbox vs transformers vs TransformerLens benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and rounds (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every peer (default 1)")
    parser.add_argument("--shape", default="small", choices=("small", "tiny"), help="GPT-2 shape (default small)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per case")
    parser.add_argument("--no-tl", action="store_true", help="leave TransformerLens out even if installed")
    parser.add_argument("--no-remote", action="store_true",
                        help="leave out the peers in their own environments (TransformerLens 4, nnsight)")
    for name, (python, _) in REMOTE.items():
        flag = "--" + name.split()[0].lower() + "-python"
        parser.add_argument(flag, default=python, help=f"{name}'s interpreter (default {python})")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument("--only", default=None, help="comma-separated cases: forward,cache,patterns,noop,sweep,load,memory")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json"))
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    rounds = args.rounds or plan["rounds"]
    only = set(args.only.split(",")) if args.only else None
    want = (lambda name: only is None or name in only)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()

    started = time.time()
    p = build_peers(args.shape, args.seed, with_tl=not args.no_tl)
    if not args.no_remote:
        start_remote(p, args.shape, args.seed, args.threads,
                     {name: getattr(args, name.split()[0].lower() + "_python") for name in REMOTE})
    info = machine(args.threads)
    info["remote"] = {name: r.version for name, r in p.remote.items()}
    info["remote_absent"] = dict(p.remote_absent)
    info["remote_round_trip_s"] = {name: r.round_trip_s() for name, r in p.remote.items()}
    print(f"worker peers: {info['remote']}, pipe round trip {info['remote_round_trip_s']}, absent {p.remote_absent}",
          flush=True)
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} with {args.threads} thread(s), "
          f"transformers {info['transformers']}, TransformerLens {info['transformer_lens'] or 'absent: ' + str(p.tl_error)}",
          flush=True)
    results = []

    def record(result: dict) -> None:
        results.append(result)
        print(table([result]).splitlines()[-1], flush=True)

    if want("forward"):
        for batch, pos in plan["forward"]:
            record(cases.forward(p, batch, pos, rounds, args.seed))
    if want("cache"):
        for batch, pos in plan["cache"]:
            record(cases.run_with_cache(p, batch, pos, rounds, args.seed, only_patterns=False))
    if want("patterns"):
        for batch, pos in plan["patterns"]:
            record(cases.run_with_cache(p, batch, pos, rounds, args.seed, only_patterns=True))
    if want("noop"):
        for batch, pos in plan["noop"]:
            record(cases.run_with_noop_hooks(p, batch, pos, rounds, args.seed))
    if want("sweep"):
        record(sweep.resid_pre_sweep(p, 16, args.rounds or plan["sweep_rounds"], args.seed))
    if want("load"):
        record(cases.load_time(p, args.rounds or plan["load_rounds"]))
    mem = []
    if want("memory") and not args.no_memory:
        for batch, pos in plan["memory"]:
            predicted = p.glassbox.cache_size((batch, pos)) + sum(t.nbytes for t in p.glassbox.parameters())
            for peer in ("glassbox", "TransformerLens") if p.tl is not None else ("glassbox",):
                mem.append(memory.measure(peer, args.shape, batch, pos, args.threads, sys.executable, predicted))
                print(memory_table(mem[-1:]), flush=True)

    for remote in p.remote.values():
        remote.close()
    print("\n" + table(results))
    if mem:
        print(memory_table(mem))
    out = {"machine": info, "command": " ".join([sys.executable] + sys.argv),
           "shape": args.shape, "seed": args.seed, "quick": args.quick, "seconds": time.time() - started,
           "cases": results, "memory": mem}
    for r in results:
        r["ratios"] = {"glassbox/transformers": paired(r, "glassbox", "transformers"),
                       "TransformerLens/transformers": paired(r, "TransformerLens", "transformers"),
                       "TransformerLens/glassbox": paired(r, "TransformerLens", "glassbox"),
                       **{f"{n}/transformers": paired(r, n, "transformers") for n in REMOTE},
                       **{f"{n}/glassbox": paired(r, n, "glassbox") for n in REMOTE}}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
