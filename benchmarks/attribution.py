"""Attribution benchmarks: gradient estimates against the exact batched sweeps they stand in for.

    python benchmarks/attribution.py [--pos 16[,32...]] [--rounds 3] [--threads 1] [--shape small|tiny] [--out FILE]

One seeded random GPT-2 (the GPT-2-small shape by default: 12 layers, 12 heads, d_model 768), built
as ``benchmarks/run.py`` builds it (``transformers`` weights given to glassbox by ``from_hf``), one
clean and one corrupted prompt of ``--pos`` random tokens (each length given), batch 1, the logit
difference of two fixed tokens at the last position. Two cases, each timed interleaved
(``timing.py``), ratios paired per round:

1. AtP over every head x position (``attribution_patch(..., "z", ("layer", "pos", "head"))``) against
   the exact batched sweep of the same nodes (``patch_head_z_by_pos``), both given the same clean
   cache of ``hook_z`` (each runs its own corrupted forward inside the timing); a third peer is AtP
   running its own clean forward too. Reported with the Spearman rank correlation of the AtP
   estimates with the exact values, and the overlap of their top 10 nodes by |effect|, on this random
   model. Target: the sweep takes >= 100x AtP's time.
2. EAP over every edge (``eap(..., method="EAP")``: clean and corrupted forwards and one backward,
   all inside the timing) against one exact ``resid_pre`` sweep (``patch_resid_pre``, every layer x
   position, given its clean cache, as in ``run.py``). Target: EAP <= 3x the sweep.

Not a test; nothing here runs in the suite. Results go to ``--out`` (JSON, every time).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import tokens  # noqa: E402
from peers import SHAPES, build_glassbox, build_hf  # noqa: E402
from sweep import answer_ids  # noqa: E402
from timing import interleaved  # noqa: E402


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two flat tensors (average ranks for ties), via scipy."""
    from scipy.stats import spearmanr

    return float(spearmanr(a.reshape(-1).double().cpu().numpy(), b.reshape(-1).double().cpu().numpy()).statistic)


def top_overlap(a: torch.Tensor, b: torch.Tensor, k: int = 10) -> int:
    """How many of a's k largest entries by |value| are among b's k largest."""
    top = lambda t: set(torch.topk(t.reshape(-1).abs(), k).indices.tolist())
    return len(top(a) & top(b))


def atp_case(model, clean, corrupted, metric, rounds: int) -> dict:
    from glassbox.interp.attribution.atp import attribution_patch
    from glassbox.interp.patching import patch_head_z_by_pos

    with torch.inference_mode():
        _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("attn.hook_z"), return_type=None)
    cache = {name: value.clone() for name, value in cache.items()}  # ordinary tensors: AtP differentiates beside them
    axes = ("layer", "pos", "head")

    def exact():
        with torch.inference_mode():
            return patch_head_z_by_pos(model, corrupted, cache, metric)

    fns = {"exact sweep": exact,
           "AtP": lambda: attribution_patch(model, clean, corrupted, metric, "z", axes, clean_cache=cache),
           "AtP + clean forward": lambda: attribution_patch(model, clean, corrupted, metric, "z", axes)}
    exact_values = exact().values.detach()
    atp_values = fns["AtP"]().values.detach()
    with torch.inference_mode():
        base = float(metric(model(corrupted))[0])
    timed = interleaved(fns, "AtP", rounds, warmup=1)
    n_nodes = exact_values.numel()
    paired = lambda a, b: statistics.median(x / y for x, y in zip(timed[a]["times_s"], timed[b]["times_s"]))
    return {"case": "AtP, every head x position (z)", "nodes": n_nodes, "peers": timed,
            "sweep_over_atp": timed["exact sweep"]["ratio_vs_AtP"],
            "sweep_over_atp_with_clean_forward": paired("exact sweep", "AtP + clean forward"),
            "spearman": spearman(atp_values, exact_values),
            "top10_overlap": top_overlap(atp_values - base, exact_values - base),
            "max_abs_error": float((atp_values - exact_values).abs().max()),
            "max_abs_effect": float((exact_values - base).abs().max()),
            "note": f"{n_nodes} nodes: patch_head_z_by_pos batched sweep vs attribution_patch, both given the clean "
                    "hook_z cache; 'AtP + clean forward' runs its own clean forward"}


def eap_case(model, clean, corrupted, metric, rounds: int) -> dict:
    from glassbox.interp.attribution.eap import eap
    from glassbox.interp.patching import patch_resid_pre

    names = [f"blocks.{L}.hook_resid_pre" for L in range(model.cfg.n_layers)]
    with torch.inference_mode():
        _, cache = model.run_with_cache(clean, names_filter=names, return_type=None)

    def sweep():
        with torch.inference_mode():
            return patch_resid_pre(model, corrupted, cache, metric)

    fns = {"resid_pre sweep": sweep, "EAP": lambda: eap(model, clean, corrupted, metric, method="EAP")}
    graph = fns["EAP"]()
    timed = interleaved(fns, "resid_pre sweep", rounds, warmup=1)
    return {"case": "EAP, every edge", "edges": graph.n_edges, "peers": timed,
            "eap_over_sweep": timed["EAP"]["ratio_vs_resid_pre sweep"],
            "note": f"eap(method='EAP') over {graph.n_edges} edges (clean and corrupted forwards and the backward "
                    f"timed) vs patch_resid_pre ({model.cfg.n_layers} layers x {clean.shape[1]} positions) given "
                    "its clean cache"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="AtP and EAP against the exact batched sweeps")
    parser.add_argument("--shape", default="small", choices=tuple(SHAPES), help="GPT-2 shape (default small)")
    parser.add_argument("--pos", default="16", help="prompt lengths in tokens, comma-separated (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds per case (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="comma-separated cases: atp,eap")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "results-attribution.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    want = set(args.only.split(",")) if args.only else {"atp", "eap"}
    lengths = [int(p) for p in args.pos.split(",")]
    from glassbox.interp.patching import LogitDiff
    from run import machine

    started = time.time()
    model = build_glassbox(build_hf(args.shape, args.seed))
    vocab = model.cfg.d_vocab
    metric = LogitDiff(*answer_ids(vocab))
    info = machine(args.threads)
    print(f"{info['cpu']}, {info['cores']} cores, torch {info['torch']} with {args.threads} thread(s); shape "
          f"{args.shape} ({model.cfg.n_layers} layers, {model.cfg.n_heads} heads, d_model {model.cfg.d_model})",
          flush=True)
    results = []
    for pos in lengths:
        clean, corrupted = tokens(1, pos, vocab, args.seed + 1), tokens(1, pos, vocab, args.seed + 2)
        if "atp" in want:
            r = atp_case(model, clean, corrupted, metric, args.rounds)
            r["shape"] = f"1x{pos}"
            results.append(r)
            p = r["peers"]
            print(f"1x{pos} {r['case']}: {r['nodes']} nodes; exact sweep {p['exact sweep']['median_s']:.3f} s, AtP "
                  f"{p['AtP']['median_s']:.4f} s, AtP + clean forward {p['AtP + clean forward']['median_s']:.4f} s; "
                  f"sweep / AtP {r['sweep_over_atp']:.1f}x (target >= 100x), sweep / (AtP + clean forward) "
                  f"{r['sweep_over_atp_with_clean_forward']:.1f}x; Spearman {r['spearman']:.3f}, top-10 overlap "
                  f"{r['top10_overlap']}/10", flush=True)
        if "eap" in want:
            r = eap_case(model, clean, corrupted, metric, args.rounds)
            r["shape"] = f"1x{pos}"
            results.append(r)
            p = r["peers"]
            print(f"1x{pos} {r['case']}: {r['edges']} edges; EAP {p['EAP']['median_s']:.3f} s, resid_pre sweep "
                  f"{p['resid_pre sweep']['median_s']:.3f} s; EAP / sweep {r['eap_over_sweep']:.2f}x (target <= 3x)",
                  flush=True)
    out = {"machine": info, "command": " ".join([sys.executable] + sys.argv), "shape": args.shape,
           "pos": lengths, "seed": args.seed, "seconds": time.time() - started, "cases": results}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({out['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
