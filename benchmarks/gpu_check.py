"""glassbox against ``transformers`` on an accelerator: forward, full cache, resid_pre sweep, AtP.

    python benchmarks/gpu_check.py [--device cuda] [--shapes small,medium] [--rounds 10] [--out FILE]

Run by ``benchmarks/gpu_check.sh`` after the parity tests. For each GPT-2 shape (seeded random
weights, ``peers.build_hf``) and each dtype it checks that glassbox and ``transformers`` (default
``sdpa`` attention) agree, then times them interleaved (``timing.py``, the device synchronised after
every call) and prints one table:

- forward, float32 and bfloat16: logits; float32 elementwise within ``F32_ATOL``, bfloat16 by mean
  |error| against the float32 ``transformers`` logits, at most ``HALF_RATIO`` x ``transformers``' own;
- full cache (``run_with_cache``, every hook) vs a plain ``transformers`` forward: the logits as
  above and, in float32, every ``resid_pre`` against ``transformers``' hidden states;
- resid_pre sweep (float32, 1 x 16): ``activation_patch(..., "resid_pre", ("layer", "pos"))`` vs
  the loop of ``sweep.hf_sweep`` (one patched ``transformers`` forward per layer x position);
- AtP (float32, 1 x 16): ``attribution_patch(..., "z", ("layer", "pos", "head"))`` vs the exact
  batched sweep it estimates (``patch_head_z_by_pos``), both given the clean ``hook_z`` cache:
  ``transformers`` has no AtP, so this row's reference is glassbox's exact sweep.

``--device cpu --shapes tiny`` runs the same code on the CPU (how it is checked without a GPU).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from cases import max_diff, tokens  # noqa: E402
from peers import build_hf  # noqa: E402
from sweep import answer_ids, hf_sweep  # noqa: E402
from timing import interleaved  # noqa: E402

F32_ATOL = 1e-3  # float32 logits of a 12/24-layer model on a GPU (CPU: ~4e-6); a wrong model is off by ~1
SWEEP_ATOL = 1e-4  # float32 logit differences of patched runs (CPU: ~2e-6)
HALF_RATIO = 1.5  # glassbox's bfloat16 mean |error| <= this x transformers' own (both against float32)
FORWARD = [(1, 128), (8, 1024)]
CACHE = [(1, 1024), (4, 1024)]


def synced(fn, device):
    if torch.device(device).type != "cuda":
        return fn
    return lambda: (fn(), torch.cuda.synchronize())


def timed(fns: dict, reference: str, rounds: int, device: str) -> dict:
    with torch.inference_mode():
        return interleaved({k: synced(f, device) for k, f in fns.items()}, reference, rounds, warmup=2)


def agree_logits(case: str, dtype, ours, theirs, want32) -> float:
    """float32: max |ours - theirs|; half: mean error ratio against transformers' float32 logits."""
    if dtype == torch.float32:
        return max_diff(case, "glassbox", ours.float(), theirs.float(), F32_ATOL)
    mine = (ours.double() - want32.double()).abs().mean().item()
    ref = (theirs.double() - want32.double()).abs().mean().item()
    if not (ref > 0 and mine <= HALF_RATIO * ref):
        raise AssertionError(f"{case} {dtype}: glassbox mean error {mine:.3g} vs transformers' {ref:.3g}")
    return mine / ref


def row(case, shape, dtype, model, t, gb="glassbox", ref="transformers", agreement=None, what=""):
    ratio = statistics.median(a / b for a, b in zip(t[gb]["times_s"], t[ref]["times_s"]))
    return {"case": case, "model": model, "shape": shape, "dtype": str(dtype).replace("torch.", ""),
            "glassbox_s": t[gb]["median_s"], "reference_s": t[ref]["median_s"], "reference": ref,
            "ratio": ratio, "agreement": agreement, "agreement_is": what, "times": t}


def shape_rows(shape: str, device: str, rounds: int, seed: int, dtypes) -> list:
    from glassbox.interp.attribution import attribution_patch
    from glassbox.interp.patching import LogitDiff, activation_patch, patch_head_z_by_pos
    from glassbox.weights import from_hf

    hf32 = build_hf(shape, seed).to(device)
    n_layers, vocab = hf32.config.n_layer, hf32.config.vocab_size
    rows = []
    forward_shapes, cache_shapes = (FORWARD, CACHE) if shape != "tiny" else ([(1, 16)], [(1, 32)])
    for dtype in dtypes:
        hf = hf32 if dtype == torch.float32 else build_hf(shape, seed).to(device=device, dtype=dtype)
        gb = from_hf(hf, device=device, dtype=dtype).eval()
        for batch, pos in forward_shapes:
            x = tokens(batch, pos, vocab, seed).to(device)
            fns = {"transformers": lambda: hf(x, use_cache=False).logits, "glassbox": lambda: gb(x)}
            with torch.inference_mode():
                want32 = hf32(x, use_cache=False).logits
                agreement = agree_logits("forward", dtype, fns["glassbox"](), fns["transformers"](), want32)
            rows.append(row("forward", f"{batch}x{pos}", dtype, shape, timed(fns, "transformers", rounds, device),
                            agreement=agreement, what="max |diff|" if dtype == torch.float32 else "error ratio"))
            del want32
        for batch, pos in cache_shapes:
            x = tokens(batch, pos, vocab, seed).to(device)
            fns = {"transformers": lambda: hf(x, use_cache=False).logits, "glassbox": lambda: gb.run_with_cache(x)}
            with torch.inference_mode():
                logits, cache = fns["glassbox"]()
                if dtype == torch.float32:
                    hidden = hf32(x, use_cache=False, output_hidden_states=True).hidden_states
                    agreement = max(max_diff("full cache", f"glassbox blocks.{L}.hook_resid_pre",
                                             cache[f"blocks.{L}.hook_resid_pre"], hidden[L], F32_ATOL)
                                    for L in range(n_layers))
                    agreement = max(agreement, max_diff("full cache", "glassbox logits", logits,
                                                        fns["transformers"](), F32_ATOL))
                    del hidden
                else:
                    agreement = agree_logits("full cache", dtype, logits, fns["transformers"](),
                                             hf32(x, use_cache=False).logits)
                del logits, cache
            rows.append(row("full cache", f"{batch}x{pos}", dtype, shape, timed(fns, "transformers", rounds, device),
                            agreement=agreement, what="max |diff|" if dtype == torch.float32 else "error ratio"))
        if device != "cpu":
            torch.cuda.empty_cache()
        if dtype != torch.float32:
            continue
        pos = 16
        clean, corrupted = tokens(1, pos, vocab, seed + 1).to(device), tokens(1, pos, vocab, seed + 2).to(device)
        correct, wrong = answer_ids(vocab)
        metric = LogitDiff(correct, wrong)
        with torch.inference_mode():
            _, resid = gb.run_with_cache(clean, names_filter=[f"blocks.{L}.hook_resid_pre" for L in range(n_layers)],
                                         return_type=None)
            _, zs = gb.run_with_cache(clean, names_filter=lambda n: n.endswith("attn.hook_z"), return_type=None)
        zs = {name: value.clone() for name, value in zs.items()}  # ordinary tensors: AtP differentiates beside them
        fns = {"transformers": lambda: hf_sweep(hf, clean, corrupted, correct, wrong),
               "glassbox": lambda: activation_patch(gb, corrupted, resid, metric, "resid_pre", ("layer", "pos")).values}
        with torch.inference_mode():
            agreement = max_diff("resid_pre sweep", "glassbox", fns["glassbox"]().float().cpu(),
                                 fns["transformers"]().float().cpu(), SWEEP_ATOL)
        t = timed(fns, "transformers", max(2, rounds // 3), device)
        rows.append(row("resid_pre sweep", f"1x{pos}", dtype, shape, t, agreement=agreement, what="max |diff|"))

        def exact():
            with torch.inference_mode():
                return patch_head_z_by_pos(gb, corrupted, zs, metric).values

        atp = lambda: attribution_patch(gb, clean, corrupted, metric, "z", ("layer", "pos", "head"),  # noqa: E731
                                        clean_cache=zs).values
        fns = {"exact z sweep": exact, "glassbox": atp}
        estimate, truth = atp().detach().float().cpu(), exact().float().cpu()
        from attribution import spearman

        t = interleaved({k: synced(f, device) for k, f in fns.items()}, "exact z sweep", rounds, warmup=2)
        rows.append(row("AtP (z, layer x pos x head)", f"1x{pos}", dtype, shape, t, ref="exact z sweep",
                        agreement=spearman(estimate, truth), what="Spearman vs exact"))
    return rows


def table(rows: list) -> str:
    head = (f"{'case':<28} {'model':>6} {'shape':>7} {'dtype':>8} {'glassbox ms':>11} {'ref ms':>9} {'gb/ref':>6}  "
            f"{'reference':<14} agreement")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:<28} {r['model']:>6} {r['shape']:>7} {r['dtype']:>8} {r['glassbox_s'] * 1e3:11.2f} "
                     f"{r['reference_s'] * 1e3:9.2f} {r['ratio']:6.2f}  {r['reference']:<14} "
                     f"{r['agreement_is']} {r['agreement']:.3g}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="glassbox vs transformers on an accelerator")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="small,medium", help="comma-separated: small, medium, tiny")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results-gpu.json"))
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py: no CUDA device (torch.cuda.is_available() is False): nothing was run", file=sys.stderr)
        return 2
    import transformers

    transformers.utils.logging.disable_progress_bar()
    started = time.time()
    name = torch.cuda.get_device_name(0) if torch.device(args.device).type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        rows += shape_rows(shape, args.device, args.rounds, args.seed, dtypes)
        print(f"{shape}: done ({time.time() - started:.0f} s)", flush=True)
    print(table(rows))
    with open(args.out, "w") as f:
        json.dump({"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
                   "command": " ".join([sys.executable] + sys.argv), "seconds": time.time() - started,
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.out} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
