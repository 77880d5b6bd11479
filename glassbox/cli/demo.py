"""``glassbox demo``: the whole story on one model, written to DIR/index.html and DIR/summary.json."""

from ..weights.pretrained import DEFAULT_MODEL

DEFAULT_PROMPT = ("Elizabeth read the letter again, and then walked to the window. When Jane came in, "
                  "Elizabeth read the")


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="parity, attention, heads, logit lens and patching in one report")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"hub name, folder or shipped model (default {DEFAULT_MODEL})")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="a prompt that repeats a phrase: '... phrase ANSWER ... phrase'")
    p.add_argument("--answer", default=" letter", help="the token after the phrase's first occurrence")
    p.add_argument("--distractor", default=" garden", help="what the corrupted prompt has in its place")
    p.add_argument("--out", default="glassbox-report", help="output folder")
    p.add_argument("--device", default=None)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..interp.report import build_report
    from ..models import HookedTransformer

    torch.manual_seed(0)
    model = HookedTransformer.from_pretrained(args.model, device=args.device)
    summary = build_report(model, args.prompt, args.answer, args.distractor, args.out)
    print(f"model {summary['model']['name']}: {summary['model']['n_layers']} layers, "
          f"{summary['model']['parameters']:,} parameters")
    print(f"parity with transformers: worst relative difference {summary['parity_worst_relative']:.1e}")
    best = lambda rows: ", ".join(f"L{r['layer']}H{r['head']} {r['score']:.2f}" for r in rows[:3])
    print(f"previous-token heads: {best(summary['previous_token_heads'])}")
    print(f"induction heads: {best(summary['induction_heads'])}")
    patch = summary["patching"]
    print(f"logit difference {args.answer!r} - {args.distractor!r}: clean {patch['clean_logit_diff']:.2f}, "
          f"corrupted {patch['corrupted_logit_diff']:.2f}")
    print(f"report: {summary['report']} (and summary.json beside it) in {summary['seconds']:.1f} s")
    return 0
