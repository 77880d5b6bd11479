"""Indirect object identification (IOI) in GPT-2 small: activation patching and path patching.

    python examples/ioi_patching.py [--model gpt2] [--out ioi_patching.html]

"When Mary and John went to the store, John gave a drink to" -> " Mary": GPT-2 small completes the
indirect object (IO) rather than the repeated subject (S). Wang et al. (2022) traced the circuit:
name mover heads (9.6, 9.9, 10.0) copy the IO name into the logits, steered by S-inhibition heads
(7.3, 7.9, 8.6, 8.10). This script reproduces the measurements, with the corrupted prompt of each
clean one being the same template with the two names swapped, so the right answer flips:

1. the logit difference logit(IO) - logit(S) at the last position, clean and corrupted;
2. patching the residual stream (layer x position) and each head's output (layer x head) from clean
   into corrupted, as a normalised metric: 1 = the clean logit difference, 0 = the corrupted one;
3. path patching: the name movers' effect directly on the logits, and every earlier head's effect
   through the name movers' queries (the S-inhibition heads should stand out).

Needs the GPT-2 small weights (``--model gpt2`` from the Hugging Face cache, or a local folder); it
says so and exits when they are not available.
"""

import argparse
import sys

import torch

from glassbox.interp.patching import (LogitDiff, Normalized, patch_head_z, patch_resid_pre, path_patch,
                                      path_patch_heads)
from glassbox.interp.plots import patching_heatmap, save_html
from glassbox.models import HookedTransformer

TEMPLATES = [
    "When{A} and{B} went to the store,{S} gave a drink to",
    "When{A} and{B} went to the park,{S} gave a ball to",
    "Then,{A} and{B} had a long argument, and afterwards{S} said to",
    "After{A} and{B} went to the office,{S} handed a letter to",
]
NAME_PAIRS = [(" Mary", " John"), (" Tom", " James"), (" Dan", " Sid"), (" Amy", " Martin")]
NAME_MOVERS = [(9, 6), (9, 9), (10, 0)]


def prompts():
    """Clean prompts and answers, and corrupted ones with the two names swapped (answers flip)."""
    clean, corrupted, io, s = [], [], [], []
    for template, (a, b) in zip(TEMPLATES, NAME_PAIRS):
        clean.append(template.format(A=a, B=b, S=b))  # IO = a, S = b
        corrupted.append(template.format(A=b, B=a, S=a))  # IO = b, S = a
        io.append(a)
        s.append(b)
    return clean, corrupted, io, s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", help="hub name or folder of GPT-2 small weights")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default="ioi_patching.html")
    args = parser.parse_args(argv)
    try:
        model = HookedTransformer.from_pretrained(args.model, device=args.device).eval()
    except (OSError, ValueError) as err:
        print(f"SKIPPED: this example needs GPT-2 small's weights, which are not available here: {err}")
        return 0
    clean_text, corrupted_text, io, s = prompts()
    # Templates differ in length: a right-padded batch, its mask passed everywhere, and the metric
    # reading each prompt's last real token.
    clean, mask = model.tokenize(clean_text)
    corrupted, corrupted_mask = model.tokenize(corrupted_text)
    if clean.shape != corrupted.shape or not (mask is None or torch.equal(mask, corrupted_mask)):
        raise ValueError("a swapped prompt tokenizes to a different length; choose single-token names")
    last = mask.sum(1) - 1 if mask is not None else -1
    io_ids = torch.tensor([model.to_single_token(n) for n in io])
    s_ids = torch.tensor([model.to_single_token(n) for n in s])

    # 1. Logit differences.
    logit_diff = LogitDiff(io_ids, s_ids, pos=last)
    with torch.no_grad():
        clean_logits, cache = model.run_with_cache(clean, attention_mask=mask)
        corrupted_logits = model(corrupted, attention_mask=mask)
    clean_ld, corrupted_ld = logit_diff(clean_logits).mean().item(), logit_diff(corrupted_logits).mean().item()
    print(f"logit(IO) - logit(S): clean {clean_ld:.3f}, corrupted {corrupted_ld:.3f}")
    metric = Normalized(logit_diff, clean_ld, corrupted_ld)

    # 2. Activation patching.
    resid = patch_resid_pre(model, corrupted, cache, metric, attention_mask=mask, progress=True)
    heads = patch_head_z(model, corrupted, cache, metric, attention_mask=mask, progress=True)
    top = heads.values.abs().flatten().topk(6).indices.tolist()
    print("heads whose output matters most (layer.head: normalised metric):")
    for i in top:
        layer, head = divmod(i, model.cfg.n_heads)
        print(f"  {layer}.{head}: {heads.values[layer, head].item():+.3f}")

    # 3. Path patching: name movers -> logits, and every earlier head -> name movers' queries.
    direct = path_patch(model, corrupted, cache, metric, NAME_MOVERS, "logits", attention_mask=mask)
    print(f"name movers {NAME_MOVERS} -> logits alone restore {direct.item():.3f} of the logit difference")
    into_movers = path_patch_heads(model, corrupted, cache, metric, [(l, h, "q") for l, h in NAME_MOVERS],
                                   attention_mask=mask, progress=True)
    scores = torch.nan_to_num(into_movers.values, nan=0.0).abs().flatten()
    print("heads acting through the name movers' queries: " + ", ".join(
        f"{i // model.cfg.n_heads}.{i % model.cfg.n_heads}" for i in scores.topk(4).indices.tolist()))
    path = save_html([patching_heatmap(resid), patching_heatmap(heads),
                      patching_heatmap(into_movers, title="path patching into the name movers' queries")],
                     args.out, title="IOI in GPT-2 small: activation and path patching")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
