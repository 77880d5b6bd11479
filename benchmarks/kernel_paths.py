"""How far apart the fused and the explicit attention kernels put the logits.

    python benchmarks/kernel_paths.py [--quick] [--threads 2] [--out FILE]

Attention runs the fused ``scaled_dot_product_attention`` kernel unless something is attached to
``hook_attn_scores`` or ``hook_pattern``; then it materialises the pattern (softmax(q k^T * scale),
then pattern @ v), as every cache of the pattern does. The two agree to float rounding only. Norms
keep the fused kernel's bits whatever reads ``hook_scale`` or ``hook_normalized``, and every other hook
point is an identity, so a read there must change nothing: that column must be 0.

For each model and prompt set, the largest |logits| and the max |delta logits| of a plain forward
against:
- ``run_with_cache`` of every hook point, under ``no_grad`` (the explicit attention path);
- a reading hook at every ``hook_pattern``, under autograd (the explicit path's other arithmetic: the
  causal scores of long prompts are blocked only outside autograd);
- a reading hook at every other hook point, under autograd and ``no_grad`` (must be 0).

Models, float32: the shipped glassbox-austen; a seeded GPT-2-small shape (transformers' own
initialisation, given to glassbox by ``from_hf``, as ``benchmarks/run.py`` builds it); a seeded
Llama shape (RMSNorm, rotary, grouped-query 8/2, SwiGLU; glassbox's initialisation). Prompts: seeded
random tokens, batch 1 at lengths from 1 to n_ctx, and padded batches (left and right; pads are
masked out of the comparison). ``--quick`` leaves out the GPT-2-small prompts longer than 256.

Not a test; nothing here runs in the suite (tests/test_kernel_path_bounds.py checks the bounds on
small models). Results go to ``--out`` (JSON) when given.
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def austen():
    from glassbox import HookedTransformer

    return HookedTransformer.from_pretrained("glassbox-austen")


def gpt2_small():
    from peers import build_glassbox, build_hf

    return build_glassbox(build_hf("small", seed=0))


def llama_shape():
    from glassbox.models import Config, HookedTransformer

    torch.manual_seed(0)
    cfg = Config(d_model=256, n_layers=4, n_heads=8, n_key_value_heads=2, d_head=32, d_mlp=688, d_vocab=1000,
                 n_ctx=512, normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu", use_bias=False,
                 qkv_bias=False, attn_out_bias=False, mlp_bias=False, init_range=0.02)
    return HookedTransformer(cfg).eval()


MODELS = {"glassbox-austen": austen, "GPT-2-small shape": gpt2_small, "Llama shape": llama_shape}


def prompt_sets(n_ctx: int, vocab: int, quick: bool) -> list:
    """(label, tokens, attention_mask or None) for one model."""
    g = torch.Generator().manual_seed(0)
    lengths = sorted({1, 2, 3, 7, 16, 64, 128, 256, 512, 1024, n_ctx} & set(range(1, n_ctx + 1)))
    if quick:
        lengths = [n for n in lengths if n <= 256]
    out = [(f"1 x {n}", torch.randint(0, vocab, (1, n), generator=g), None) for n in lengths]
    width = min(n_ctx, 64)
    for side in ("left", "right"):
        tokens = torch.randint(0, vocab, (4, width), generator=g)
        mask = torch.ones(4, width, dtype=torch.long)
        for row, pads in enumerate((0, 1, width // 3, width - 1)):
            if pads:
                mask[row, slice(0, pads) if side == "left" else slice(width - pads, width)] = 0
        out.append((f"4 x {width}, {side}-padded", tokens, mask))
    return out


def max_delta(a, b, mask) -> float:
    diff = (a - b).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return float(diff.max())


def measure(model, tokens, mask) -> dict:
    def read(x, hook):
        return None

    pattern = lambda name: name.endswith("hook_pattern")
    others = lambda name: not name.endswith(("hook_pattern", "hook_attn_scores"))
    with torch.no_grad():
        plain = model(tokens, attention_mask=mask)
        cached, _ = model.run_with_cache(tokens, attention_mask=mask, check_memory=False)
        with model.hooks(fwd_hooks=[(others, read)]):
            others_no_grad = model(tokens, attention_mask=mask)
    with model.hooks(fwd_hooks=[(pattern, read)]):
        pattern_grad = model(tokens, attention_mask=mask).detach()
    with model.hooks(fwd_hooks=[(others, read)]):
        others_grad = model(tokens, attention_mask=mask).detach()
    return {"max_abs_logit": max_delta(plain, 0 * plain, mask),
            "run_with_cache": max_delta(cached, plain, mask),
            "pattern_hooked_grad": max_delta(pattern_grad, plain, mask),
            "other_hooks": max(max_delta(others_no_grad, plain, mask), max_delta(others_grad, plain, mask))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="GPT-2-small prompts up to 256 tokens")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"{'model':<18} {'prompts':<22} {'max|logit|':>10} {'run_with_cache':>15} {'pattern, grad':>14} "
          f"{'other hooks':>12}")
    for name, build in MODELS.items():
        model = build()
        cfg = model.cfg
        for label, tokens, mask in prompt_sets(cfg.n_ctx, cfg.d_vocab, args.quick):
            start = time.time()
            row = {"model": name, "prompts": label, **measure(model, tokens, mask), "seconds": time.time() - start}
            rows.append(row)
            print(f"{name:<18} {label:<22} {row['max_abs_logit']:>10.3g} {row['run_with_cache']:>15.2e} "
                  f"{row['pattern_hooked_grad']:>14.2e} {row['other_hooks']:>12.2e}", flush=True)
    worst = max(max(r["run_with_cache"], r["pattern_hooked_grad"]) for r in rows)
    print(f"largest |delta logits|, fused against explicit attention: {worst:.2e}; "
          f"any other hook: {max(r['other_hooks'] for r in rows):.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
