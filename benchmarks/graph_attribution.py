"""Attribution-graph benchmark: glassbox's ``attribute`` on a GPT-2-small-shape model with 12 per-layer
transcoders, time and peak memory; circuit-tracer's peer numbers from ``benchmarks/ct_attribute_peer.py``.

    PYTHONPATH=. python benchmarks/graph_attribution.py [--pos 64] [--d-transcoder 4096] [--active-per-token 8]
        [--batch-size 64] [--threads 1] [--rounds 3] [--shape small|tiny] [--sweep] [--peer .ctenv/bin/python]
        [--out benchmarks/results-graph.json]

The model is a seeded random glassbox model of GPT-2 small's shape (12 layers, d_model 768, 12 heads, GPT-2's
vocabulary); the transcoders are 12 seeded random per-layer ReLU transcoders of ``--d-transcoder`` features
reading ``hook_resid_mid`` (as the peer's), each encoder bias set from a calibration forward so that on average
``--active-per-token`` features fire per layer and position. The prompt is BOS + ``--pos - 1`` seeded tokens.
Each measurement runs in a fresh process (``--one``): ``seconds`` is each round's ``attribute`` wall time and
their median; ``peak_rss_bytes`` the process's peak resident memory during the timed calls (``VmHWM`` after
``/proc/self/clear_refs``, the peer's method), after a warm-up call on the prompt's first 8 tokens and with
no earlier graph held (the peer drops its graph before each round too). ``--sweep`` measures the growth
with prompt length (16, 32, 64) and with active features per token (4, 8, 16). ``--peer PYTHON`` runs
circuit-tracer's peer with that interpreter (its environment: ``bash .ci/ct_env .ctenv``) on the same sizes
and threads and reports the ratios.
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"small": (12, 768, 12), "tiny": (2, 64, 4)}
HERE = Path(__file__).resolve().parent


def vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(args) -> dict:
    import torch

    from glassbox import HookedTransformer
    from glassbox.interp.graphs import attribute
    from glassbox.interp.transcoders import seeded_set
    from glassbox.models.presets import preset_config

    torch.set_num_threads(args.threads)
    n_layers, d_model, n_heads = SHAPES[args.shape]
    torch.manual_seed(0)
    model = HookedTransformer(preset_config("gpt2", n_layers=n_layers, d_model=d_model, n_heads=n_heads))
    ts = seeded_set(n_layers, d_model, args.d_transcoder, seed=1, bias=0.0, input_hook="hook_resid_mid")
    tokens = torch.cat([torch.tensor([50256]), torch.randint(0, 50257, (args.pos - 1,),
                                                               generator=torch.Generator().manual_seed(2))])
    with torch.no_grad():  # calibrate: each layer's bias puts the (active x positions)-th largest pre-activation at 0
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_resid_mid"))
        for l in range(n_layers):
            pre = (cache[f"blocks.{l}.hook_resid_mid"][0, 1:] @ ts.W_enc(l) + ts.b_enc(l)).flatten()
            ts.encoder_bias[l].sub_(pre.topk(args.active_per_token * (args.pos - 1)).values[-1])
    for p in ts.parameters():
        p.requires_grad_(False)
    attribute(model, ts, tokens[:8], batch_size=args.batch_size)  # warm-up on a short prefix
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = vm("VmRSS")
    seconds = []
    for _ in range(args.rounds):
        graph = None  # as the peer: no earlier graph held during a timed call
        gc.collect()
        start = time.perf_counter()
        graph = attribute(model, ts, tokens, batch_size=args.batch_size)
        seconds.append(time.perf_counter() - start)
    return {"impl": "glassbox", "pos": args.pos, "d_transcoder": args.d_transcoder,
            "active_per_token": args.active_per_token, "threads": args.threads, "batch_size": args.batch_size,
            "seconds": seconds, "median_s": statistics.median(seconds), "peak_rss_bytes": vm("VmHWM"),
            "rss_before_bytes": before, "active_features": graph.n_features, "nodes": graph.n_nodes,
            "logits": graph.n_logits, "torch": torch.__version__}


def run_one(python: str, script: Path, args, pos: int, active: int) -> dict:
    cmd = [python, str(script), "--pos", str(pos), "--d-transcoder", str(args.d_transcoder), "--active-per-token",
           str(active), "--threads", str(args.threads), "--rounds", str(args.rounds), "--shape", args.shape,
           "--batch-size", str(args.batch_size)]
    if script.name == Path(__file__).name:
        cmd.append("--one")
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pos", type=int, default=64)
    p.add_argument("--d-transcoder", type=int, default=4096)
    p.add_argument("--active-per-token", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shape", choices=tuple(SHAPES), default="small")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--peer", default=None, help="the circuit-tracer environment's python")
    p.add_argument("--one", action="store_true", help="one measurement in this process (used by the driver)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args)))
        return
    points = [(args.pos, args.active_per_token)]
    if args.sweep:
        points += [(n, args.active_per_token) for n in (16, 32, 64) if n != args.pos]
        points += [(args.pos, k) for k in (4, 8, 16) if k != args.active_per_token]
    rows = []
    for pos, active in points:
        row = {"glassbox": run_one(sys.executable, Path(__file__), args, pos, active)}
        if args.peer:
            row["circuit_tracer"] = run_one(args.peer, HERE / "ct_attribute_peer.py", args, pos, active)
            ct = row["circuit_tracer"]
            row["speedup"] = statistics.median(ct["seconds"]) / row["glassbox"]["median_s"]
            row["memory_ratio"] = row["glassbox"]["peak_rss_bytes"] / ct["peak_rss_bytes"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        from glassbox.fs.atomic import write_text

        write_text(args.out, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
