"""Measure what a model card reports: held-out loss, induction and previous-token heads, the loss on
repeated random tokens, what zeroing each layer-0 head does to them, and greedy samples.

    python examples/model_card_numbers.py [--model glassbox-austen] [--text data/austen.txt]

The numbers in ``glassbox/assets/models/glassbox-austen/README.md`` come from this script. The
held-out text is the last 5% of ``--text``, cut as ``glassbox train`` cuts it.
"""

import argparse
import sys
from pathlib import Path

import torch

from glassbox.interp.heads import detect_head, induction_score, induction_tokens
from glassbox.models import HookedTransformer
from glassbox.train import encode_text, split_text

PROMPTS = ["It is a truth universally acknowledged", "Elizabeth", '"My dear Mr. Bennet," said his lady']


def repeat_losses(model, tokens, length: int) -> tuple:
    """Mean next-token loss on the first and on the second copy of a repeated random segment."""
    log_probs = model(tokens).log_softmax(-1)[:, :-1]
    nll = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
    return nll[:, :length - 1].mean().item(), nll[:, length:].mean().item()


def heldout_loss(model, text: str) -> tuple:
    """(mean loss, targets, windows) over every whole window of n_ctx held-out tokens after a BOS."""
    _, heldout = split_text(text, 0.05)
    stream = encode_text(heldout, model.tokenizer)
    n = model.cfg.n_ctx
    windows = len(stream) // n
    body = stream[: windows * n].view(windows, n)
    rows = torch.cat([torch.full((windows, 1), model.tokenizer.eos_token_id), body], dim=1)
    total = sum(torch.nn.functional.cross_entropy(model(rows[i:i + 32, :-1]).flatten(0, 1),
                                                  rows[i:i + 32, 1:].flatten(), reduction="sum").item()
                for i in range(0, windows, 32))
    return total / (windows * n), windows * n, windows


def grid(scores) -> str:
    return str([[round(x, 3) for x in row] for row in scores.tolist()])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="glassbox-austen")
    parser.add_argument("--text", default=str(Path(__file__).resolve().parent.parent / "data" / "austen.txt"))
    args = parser.parse_args(argv)
    model = HookedTransformer.from_pretrained(args.model).eval()
    bos = model.tokenizer.eos_token_id
    with torch.no_grad():
        loss, targets, windows = heldout_loss(model, Path(args.text).read_text(encoding="utf-8"))
        print(f"held-out loss: {loss:.3f} nats/token over {targets:,} targets ({windows} windows)")
        for length in (20, 50):
            tokens = induction_tokens(model, length, batch=8, seed=0, bos_token_id=bos)
            print(f"2 x {length} random tokens: induction {grid(induction_score(model, length, batch=8, seed=0, bos_token_id=bos))}, "
                  f"previous-token {grid(detect_head(model, tokens, 'previous_token'))}, "
                  "loss on first / second copy %.2f / %.2f" % repeat_losses(model, tokens, length))
        tokens = induction_tokens(model, 50, batch=8, seed=0, bos_token_id=bos)
        for head in range(model.cfg.n_heads):
            def zero(z, hook, head=head):
                z = z.clone()
                z[:, :, head] = 0.0
                return z

            with model.hooks([("blocks.0.attn.hook_z", zero)]):
                _, second = repeat_losses(model, tokens, 50)
                best = induction_score(model, 20, batch=8, seed=0, bos_token_id=bos).max().item()
            print(f"zeroing layer 0 head {head}: loss on the second copy {second:.2f}, best induction score {best:.2f}")
        for prompt in PROMPTS:
            ids = model.generate(model.to_tokens(prompt), max_new_tokens=40)
            print("greedy:", model.to_string(ids[0, 1:].tolist()).replace("\n", " "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
