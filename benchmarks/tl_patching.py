"""glassbox.tl's get_act_patch_* against glassbox's own activation_patch and TransformerLens 3.9.

    /work/main/.tlenv/bin/python benchmarks/tl_patching.py [--layers 2] [--rounds 2] [--tl-sample 24]

Run with an interpreter that has TransformerLens 3.9 (its own virtual environment, see README.md
here) and sees glassbox. One seeded random model of GPT-2 small's widths (d_model 768, 12 heads,
d_mlp 3072, vocab 50257) with ``--layers`` blocks (default 2, to keep the run a few minutes on two
loaded cores), and TransformerLens's twin holding the same weights. The inputs are the Activation
Patching demo's shape: 8 prompts of 15 tokens, clean and corrupted, and its metric: the logit
difference of two answers at the last position, averaged over the batch, normalised by the clean
and corrupted values.

For each function three peers run the same work, interleaved (``timing.interleaved``):
- ``glassbox.tl``: ``glassbox.tl.patching.get_act_patch_*`` with the demo's metric (a Python
  function of the whole batch's logits);
- ``glassbox``: ``activation_patch`` on the same activations and axes with
  ``Normalized(LogitDiff(...))``, glassbox's own metric (one value per prompt, then the mean);
- ``TL 3.9``: ``transformer_lens.patching.get_act_patch_*``, one forward per patch. Where the grid
  has more than ``--tl-sample`` patches, TransformerLens runs ``generic_activation_patch`` on that
  many seeded grid points (``index_df``; for a ``*_every``, that many points spread over its
  components, which it runs one after the other) and its time is scaled by grid / points: each of
  its patches is one whole forward, so its time is proportional to their number. The table marks
  those.

Before timing, each function's three results are checked: glassbox.tl against glassbox to 1e-5 and
against TransformerLens (on the sampled rows where sampled) to 1e-4; a disagreement stops the run.
Results go to ``--out`` (default benchmarks/results-tl-patching.json).
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved  # noqa: E402

N_PROMPTS, POS, VOCAB = 8, 15, 50257
# name -> (glassbox activation(s), glassbox axes, TransformerLens setter name, its activation)
FUNCTIONS = {
    "resid_pre": ("resid_pre", ("layer", "pos"), "layer_pos_patch_setter", "resid_pre"),
    "resid_mid": ("resid_mid", ("layer", "pos"), "layer_pos_patch_setter", "resid_mid"),
    "attn_out": ("attn_out", ("layer", "pos"), "layer_pos_patch_setter", "attn_out"),
    "mlp_out": ("mlp_out", ("layer", "pos"), "layer_pos_patch_setter", "mlp_out"),
    "attn_head_out_all_pos": ("z", ("layer", "head"), "layer_head_vector_patch_setter", "z"),
    "attn_head_q_all_pos": ("q", ("layer", "head"), "layer_head_vector_patch_setter", "q"),
    "attn_head_k_all_pos": ("k", ("layer", "head"), "layer_head_vector_patch_setter", "k"),
    "attn_head_v_all_pos": ("v", ("layer", "head"), "layer_head_vector_patch_setter", "v"),
    "attn_head_pattern_all_pos": ("pattern", ("layer", "head"), "layer_head_pattern_patch_setter", "pattern"),
    "attn_head_out_by_pos": ("z", ("layer", "pos", "head"), "layer_pos_head_vector_patch_setter", "z"),
    "attn_head_q_by_pos": ("q", ("layer", "pos", "head"), "layer_pos_head_vector_patch_setter", "q"),
    "attn_head_k_by_pos": ("k", ("layer", "pos", "head"), "layer_pos_head_vector_patch_setter", "k"),
    "attn_head_v_by_pos": ("v", ("layer", "pos", "head"), "layer_pos_head_vector_patch_setter", "v"),
    "attn_head_pattern_by_pos": ("pattern", ("layer", "head", "query_pos"), "layer_head_pos_pattern_patch_setter",
                                 "pattern"),
    "attn_head_pattern_dest_src_pos": ("pattern", ("layer", "head", "query_pos", "key_pos"),
                                       "layer_head_dest_src_pos_pattern_patch_setter", "pattern"),
    "attn_head_all_pos_every": (["z", "q", "k", "v", "pattern"], ("layer", "head"), None, None),
    "attn_head_by_pos_every": (None, None, None, None),  # two glassbox sweeps, see glassbox_work
    "block_every": (["resid_pre", "attn_out", "mlp_out"], ("layer", "pos"), None, None),
}


def build(layers: int, seed: int):
    """A glassbox model, its TransformerLens twin (same weights), the demo's tokens and answers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from glassbox.weights import from_hf
    from peers import build_tl

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=VOCAB, n_positions=1024)
    hf = GPT2LMHeadModel(config).eval()
    ours = from_hf(hf).eval()
    theirs = build_tl(hf)
    generator = torch.Generator().manual_seed(seed + 1)
    clean = torch.randint(0, VOCAB, (N_PROMPTS, POS), generator=generator)
    corrupted = torch.randint(0, VOCAB, (N_PROMPTS, POS), generator=generator)
    answers = torch.randint(0, VOCAB, (N_PROMPTS, 2), generator=generator)
    return ours, theirs, clean, corrupted, answers


def demo_metric(answers, clean_ld: float, corrupted_ld: float):
    """The Activation Patching demo's ioi_metric (a batch mean of logit differences, normalised)."""
    def get_logit_diff(logits):
        if len(logits.shape) == 3:
            logits = logits[:, -1, :]
        correct = logits.gather(1, answers[:, 0].unsqueeze(1))
        incorrect = logits.gather(1, answers[:, 1].unsqueeze(1))
        return (correct - incorrect).mean()

    def ioi_metric(logits):
        return (get_logit_diff(logits) - corrupted_ld) / (clean_ld - corrupted_ld)
    return get_logit_diff, ioi_metric


def glassbox_work(name, model, corrupted, cache, metric):
    from glassbox.interp.patching import activation_patch

    if name == "attn_head_by_pos_every":
        vectors = activation_patch(model, corrupted, cache, metric, ["z", "q", "k", "v"], ("layer", "pos", "head"))
        pattern = activation_patch(model, corrupted, cache, metric, "pattern", ("layer", "head", "query_pos"))
        return torch.cat([vectors.values, pattern.values.transpose(-2, -1)[None]])
    activation, axes = FUNCTIONS[name][:2]
    return activation_patch(model, corrupted, cache, metric, activation, axes).values


EVERY = {  # TransformerLens's *_every: its component functions, stacked in this order
    "attn_head_all_pos_every": ["attn_head_out_all_pos", "attn_head_q_all_pos", "attn_head_k_all_pos",
                                "attn_head_v_all_pos", "attn_head_pattern_all_pos"],
    "attn_head_by_pos_every": ["attn_head_out_by_pos", "attn_head_q_by_pos", "attn_head_k_by_pos",
                               "attn_head_v_by_pos", "attn_head_pattern_by_pos"],
    "block_every": ["resid_pre", "attn_out", "mlp_out"],
}
INDEX_NAMES = {"layer_pos_patch_setter": ["layer", "pos"], "layer_head_vector_patch_setter": ["layer", "head"],
               "layer_head_pattern_patch_setter": ["layer", "head"],
               "layer_pos_head_vector_patch_setter": ["layer", "pos", "head"],
               "layer_head_pos_pattern_patch_setter": ["layer", "head", "dest_pos"],
               "layer_head_dest_src_pos_pattern_patch_setter": ["layer", "head", "dest_pos", "src_pos"]}


def tl_work(name, tl_patching, model, corrupted, cache, metric, grid_shape, sample: int, seed: int):
    """(callable, grid points or None, scale): TransformerLens's whole function, or ``sample`` seeded
    grid points of it through ``generic_activation_patch(index_df=...)`` (for a *_every function, the
    same points of each component, as its components run one after the other)."""
    import itertools
    import random

    import pandas as pd

    n = int(torch.tensor(grid_shape).prod())
    if n <= sample:
        return (lambda: getattr(tl_patching, "get_act_patch_" + name)(model, corrupted, cache, metric)), None, 1.0
    if name in EVERY:
        component_shape = grid_shape[1:]
        points = random.Random(seed).sample(list(itertools.product(*(range(k) for k in component_shape))),
                                            max(1, sample // len(EVERY[name])))
        parts = []
        for component in EVERY[name]:
            setter_name, activation = FUNCTIONS[component][2:]
            order = points
            if name == "attn_head_by_pos_every" and "pattern" in component:  # stacked as [layer pos head]
                order = [(layer, head, pos) for layer, pos, head in points]
            parts.append((getattr(tl_patching, setter_name), activation,
                          pd.DataFrame(order, columns=INDEX_NAMES[setter_name])))

        def run():
            return torch.stack([tl_patching.generic_activation_patch(model, corrupted, cache, metric, setter,
                                                                     activation, index_df=frame)
                                for setter, activation, frame in parts])
        picked = [(c,) + p for c in range(len(parts)) for p in points]
        return run, ("stacked", picked), n / len(picked)
    points = random.Random(seed).sample(list(itertools.product(*(range(k) for k in grid_shape))), sample)
    setter_name, activation = FUNCTIONS[name][2:]
    frame = pd.DataFrame(points, columns=INDEX_NAMES[setter_name])
    setter = getattr(tl_patching, setter_name)
    return (lambda: tl_patching.generic_activation_patch(model, corrupted, cache, metric, setter, activation,
                                                         index_df=frame)), points, n / sample


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tl-sample", type=int, default=24)
    parser.add_argument("--only", default="", help="comma-separated function names (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results-tl-patching.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformer_lens
    import transformer_lens.patching as tl_patching

    from glassbox.interp.patching import LogitDiff, Normalized
    from glassbox.tl import patching

    ours, theirs, clean, corrupted, answers = build(args.layers, args.seed)
    get_logit_diff, _ = demo_metric(answers, 0.0, 1.0)
    with torch.no_grad():
        clean_ld, corrupted_ld = float(get_logit_diff(theirs(clean))), float(get_logit_diff(theirs(corrupted)))
    _, ioi_metric = demo_metric(answers, clean_ld, corrupted_ld)
    own_metric = Normalized(LogitDiff(answers[:, 0], answers[:, 1]), clean_ld, corrupted_ld)
    _, cache_ours = ours.run_with_cache(clean)
    _, cache_theirs = theirs.run_with_cache(clean)
    names = [n for n in FUNCTIONS if not args.only or n in args.only.split(",")]
    rows = {}
    with torch.inference_mode():
        for name in names:
            ours_fn = lambda: getattr(patching, "get_act_patch_" + name)(ours, corrupted, cache_ours, ioi_metric)
            own_fn = lambda: glassbox_work(name, ours, corrupted, cache_ours, own_metric)
            got, own = ours_fn(), own_fn()  # also the warm-up
            tl_fn, points, scale = tl_work(name, tl_patching, theirs, corrupted, cache_theirs, ioi_metric,
                                           tuple(got.shape), args.tl_sample, args.seed)
            expected = tl_fn()
            if points is None:
                picked = got
            elif isinstance(points, tuple):  # a stacked *_every: [component point]
                points = points[1]
                picked = torch.stack([got[p] for p in points])
                expected = expected.flatten()
            else:
                picked = torch.stack([got[p] for p in points])
            d_own, d_tl = float((got - own).abs().max()), float((picked - expected).abs().max())
            if d_own > 1e-5 or d_tl > 1e-4:
                raise SystemExit(f"{name}: glassbox.tl differs from glassbox by {d_own:.2e}, from "
                                 f"TransformerLens by {d_tl:.2e}")
            timed = interleaved({"glassbox.tl": ours_fn, "glassbox": own_fn, "TL 3.9": tl_fn}, "glassbox",
                                args.rounds, warmup=0)
            tl_s = timed["TL 3.9"]["median_s"] * scale
            row = {"patches": int(got.numel()), "glassbox.tl_s": timed["glassbox.tl"]["median_s"],
                   "glassbox_s": timed["glassbox"]["median_s"],
                   "tl_over_glassbox": timed["glassbox.tl"]["ratio_vs_glassbox"], "TL_s": tl_s,
                   "TL_sampled_rows": None if points is None else len(points),
                   "TL_over_glassbox.tl": tl_s / timed["glassbox.tl"]["median_s"],
                   "max_diff_glassbox": d_own, "max_diff_TL": d_tl, "times": timed}
            rows[name] = row
            print(f"{name:32s} {row['patches']:6d} patches  glassbox.tl {row['glassbox.tl_s']:7.2f} s  glassbox "
                  f"{row['glassbox_s']:7.2f} s  ratio {row['tl_over_glassbox']:.2f}  TL 3.9 {tl_s:8.1f} s"
                  f"{' (sampled ' + str(len(points)) + ')' if points else ''}  TL/glassbox.tl "
                  f"{row['TL_over_glassbox.tl']:6.1f}x", flush=True)
    meta = {"layers": args.layers, "prompts": N_PROMPTS, "positions": POS, "rounds": args.rounds,
            "threads": args.threads, "tl_sample": args.tl_sample, "transformer_lens": transformer_lens.__version__,
            "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    from glassbox.fs.atomic import write_text

    write_text(args.out, json.dumps({"meta": meta, "functions": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
