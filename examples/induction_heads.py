"""Find induction heads on repeated random tokens, plot their patterns and a patching sweep.

    python examples/induction_heads.py [--model glassbox-austen] [--out induction_heads.html]

An induction head attends from a token to the token that followed that token's previous occurrence,
and copies it: on a random sequence repeated twice, it predicts the whole second half. Steps:

1. score every head by the share of its attention on those "induction" keys (``induction_score``);
2. plot the best heads' patterns on one repeated sequence;
3. patch from the repeated sequence (clean) into one whose first half is other random tokens
   (corrupted, so nothing repeats) and measure, at the last position, how far each head's output
   restores the logit of the token the repetition predicts: a layer x head heatmap, plus the
   residual stream by layer and position.

``--model`` takes a shipped model (the default, ``glassbox-austen``, whose layer 1 head 0 is an
induction head), a hub name such as ``gpt2``, or a folder; ``--model random`` runs the pipeline on a
seeded random GPT-2-shaped model, which has no induction heads (a smoke test, not a finding).
"""

import argparse
import sys

import torch

from glassbox.interp import induction_score, induction_tokens
from glassbox.interp.patching import LogitDiff, Normalized, patch_head_z, patch_resid_pre
from glassbox.interp.plots import attention_grid, patching_heatmap, save_html
from glassbox.models import Config, HookedTransformer


def load(name: str, device):
    if name == "random":
        torch.manual_seed(0)
        return HookedTransformer(Config(d_model=128, n_layers=4, n_heads=4, d_vocab=50257, n_ctx=256), device=device)
    return HookedTransformer.from_pretrained(name, device=device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="glassbox-austen", help="shipped model, hub name, folder, or 'random'")
    parser.add_argument("--seq-len", type=int, default=20, help="length of the random segment that repeats")
    parser.add_argument("--top", type=int, default=6, help="how many of the best heads to plot")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default="induction_heads.html")
    args = parser.parse_args(argv)
    try:
        model = load(args.model, args.device).eval()
    except (OSError, ValueError) as err:
        print(f"SKIPPED: could not load the model {args.model!r}: {err}")
        return 0
    bos = model.bos_token_id if model.cfg.default_prepend_bos else None

    # 1. Induction scores of every head.
    scores, tokens = induction_score(model, args.seq_len, batch=4, bos_token_id=bos, return_tokens=True)
    top = scores.flatten().topk(min(args.top, scores.numel())).indices.tolist()
    heads = [divmod(i, model.cfg.n_heads) for i in top]
    print("best induction heads (layer.head: score):")
    for layer, head in heads:
        print(f"  {layer}.{head}: {scores[layer, head].item():.3f}")

    # 2. Their patterns on the first repeated sequence.
    names = sorted({f"blocks.{layer}.attn.hook_pattern" for layer, _ in heads})
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[:1], names_filter=names, return_type=None)
    patterns = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"][0, head] for layer, head in heads])
    labels = model.to_str_tokens(tokens[0])
    grid = attention_grid(patterns, labels, head_labels=[f"{l}.{h}" for l, h in heads], cols=3,
                          title="best induction heads on a repeated random sequence")

    # 3. Patching: clean repeats, corrupted does not; the metric is how much the repeat is predicted.
    clean = tokens
    corrupted = clean.clone()
    start = 1 if bos is not None else 0
    other = induction_tokens(model, args.seq_len, batch=clean.shape[0], seed=1, bos_token_id=bos)
    corrupted[:, start: start + args.seq_len] = other[:, start: start + args.seq_len]
    predicted = clean[:, start]  # after the last token of the segment, the segment starts again
    unpredicted = corrupted[:, start]
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith(("hook_z", "resid_pre")))
        corrupted_logits = model(corrupted)
    # LogitDiff reads the last position: how much more the segment's restart is predicted than the decoy.
    metric = Normalized.from_logits(LogitDiff(predicted, unpredicted), clean_logits, corrupted_logits)
    heads_sweep = patch_head_z(model, corrupted, clean_cache, metric, progress=True)
    resid_sweep = patch_resid_pre(model, corrupted, clean_cache, metric, progress=True)
    best = heads_sweep.values.flatten().argmax().item()
    print(f"patching one head's output restores at most {heads_sweep.values.max().item():.2f} of the "
          f"clean logit difference (head {best // model.cfg.n_heads}.{best % model.cfg.n_heads})")
    path = save_html([grid, patching_heatmap(heads_sweep), patching_heatmap(resid_sweep)], args.out,
                     title=f"induction heads in {model.cfg.model_name}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
