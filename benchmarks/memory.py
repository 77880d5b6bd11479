"""Peak resident memory of one full ``run_with_cache``, measured in a fresh subprocess.

Run by ``run.py`` as ``python benchmarks/memory.py --peer glassbox --batch 8 --pos 1024``; prints one
JSON line. The child builds a randomly initialised model directly (no ``transformers`` copy, so the
process holds only that model's weights), then caches every hook under ``torch.no_grad()`` and reports
its peak RSS (``VmHWM``) next to the bytes of the weights and of the cache. The target is
``peak_rss <= 1.15 * (weights + cache)``; the interpreter, torch and the transient attention scores
are all inside that 15%.

The parent first compares the predicted cache size with the memory available and skips (saying so)
rather than push a shared machine into swap or the OOM killer.
"""

import argparse
import json
import os
import subprocess
import sys
import warnings

HEADROOM = 1.1  # available memory needed, as a multiple of the predicted weights + cache ...
SLACK_BYTES = 2**30  # ... plus this


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def peak_rss() -> int:
    """VmHWM: this process image's peak RSS. (ru_maxrss would not do: Linux carries it across exec,
    so a child forked from a large parent would report the parent's size.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args) -> dict:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import SHAPES

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rss_start = current_rss()
    n_layer, n_embd, n_head, vocab, n_ctx = SHAPES[args.shape]
    if args.peer == "glassbox":
        from glassbox import Config, HookedTransformer

        model = HookedTransformer(Config(d_model=n_embd, n_layers=n_layer, n_heads=n_head, d_vocab=vocab, n_ctx=n_ctx))
    else:
        from transformer_lens import HookedTransformer

        from peers import hf_config, tl_config

        model = HookedTransformer(tl_config(hf_config(args.shape)), tokenizer=None, move_to_device=False)
    model.eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randint(0, vocab, (args.batch, args.pos))
    predicted = model.cache_size((args.batch, args.pos)) if args.peer == "glassbox" else None
    rss_before = current_rss()
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # glassbox's cache-budget warning: this size is the point
            _, cache = model.run_with_cache(x)
    cache_bytes = sum(t.numel() * t.element_size() for t in cache.values())
    peak = peak_rss()
    return {
        "peer": args.peer, "shape": f"{args.batch}x{args.pos}", "weights_bytes": weights,
        "cache_bytes": cache_bytes, "cache_entries": len(cache), "predicted_cache_bytes": predicted,
        "rss_at_start_bytes": rss_start, "rss_before_run_bytes": rss_before, "peak_rss_bytes": peak,
        "peak_over_weights_plus_cache": peak / (weights + cache_bytes),
    }


def measure(peer: str, shape: str, batch: int, pos: int, threads: int, python: str, predicted_bytes: int) -> dict:
    """Run the child for one peer; a skipped or failed run is reported, not raised."""
    need = HEADROOM * predicted_bytes + SLACK_BYTES
    have = available_bytes()
    base = {"peer": peer, "shape": f"{batch}x{pos}"}
    if have < need:
        return {**base, "skipped": f"needs about {need / 2**30:.1f} GiB available, the machine has "
                                   f"{have / 2**30:.1f} GiB now"}
    cmd = [python, os.path.abspath(__file__), "--child", "--peer", peer, "--shape", shape, "--batch", str(batch),
           "--pos", str(pos), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {**base, "failed": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true", help="measure in this process")
    parser.add_argument("--peer", choices=("glassbox", "TransformerLens"), default="glassbox")
    parser.add_argument("--shape", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pos", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not args.child:
        parser.error("run by run.py; pass --child to measure in this process")
    print(json.dumps(child(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
