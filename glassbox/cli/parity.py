"""``glassbox parity``: run a model and its ``transformers`` twin side by side, stage by stage."""

import time

from .common import load_model, prompt_tokens, seed_arg, text_arg
from .errors import device_arg
from .help_values import DEFAULT_MODEL, PARITY_TOLERANCE

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
TOLERANCE = PARITY_TOLERANCE  # dtype name -> the largest relative difference for which parity holds


def add_parser(sub) -> None:
    p = sub.add_parser("parity", help="compare glassbox with transformers, stage by stage",
                       description="Run a model and its transformers twin side by side, stage by stage. "
                       "Exit status: 0 when parity holds, 1 when it fails, 2 for a mistake in the arguments.")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"hub name (gpt2, ...; from the hub or the local Hugging Face cache), folder, shipped model "
                        f"(default {DEFAULT_MODEL}), or 'random' for a seeded random GPT-2-small-shape model")
    p.add_argument("--prompt", type=text_arg, default=PROMPT,
                   help="the text both models run (at most the model's n_ctx tokens; a model without a "
                        f"tokenizer runs on random token ids instead; default {PROMPT!r})")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="precision of both models; the tolerance is 1e-5 in float32, 1e-10 in float64")
    p.add_argument("--device", default=None, type=device_arg, help="e.g. cuda; default: cpu")
    p.add_argument("--seed", type=seed_arg, default=0,
                   help="seed of the random model and of the random token ids (default 0)")
    p.set_defaults(func=run)


def build_model(name, device, dtype, seed):
    import torch

    from ..models import HookedTransformer
    from ..weights import hub_config

    if name != "random":
        return load_model(name, device=device, dtype=dtype, also_accepted="'random'")
    torch.manual_seed(seed)
    return HookedTransformer(hub_config("gpt2").replace(model_name="random gpt2"), device=device, dtype=dtype)


def run(args) -> int:
    import torch

    from ..weights.parity import format_report, parity_report

    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    model = build_model(args.model, args.device, dtype, args.seed)
    try:
        model.tokenizer
    except ValueError as err:  # a model without a tokenizer: compare on random ids instead
        generator = torch.Generator().manual_seed(args.seed)
        tokens = torch.randint(0, model.cfg.d_vocab, (1, min(16, model.cfg.n_ctx)), generator=generator)
        source = f"random token ids ({err})"
    else:
        tokens, source = prompt_tokens(model, args.prompt), f"prompt {args.prompt!r}"
    rows = parity_report(model, tokens)
    print(f"model: {model.cfg.model_name} ({model.cfg.n_layers} layers, d_model {model.cfg.d_model}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters), {args.dtype}, "
          f"{tokens.shape[1]} tokens of {source}")
    print(format_report(rows))
    worst = max(r.rel_diff for r in rows)
    ok = worst <= TOLERANCE[args.dtype]
    print(f"worst relative difference {worst:.2e} (tolerance {TOLERANCE[args.dtype]:.0e}): "
          f"{'PARITY HOLDS' if ok else 'PARITY FAILS'} [{time.perf_counter() - start:.1f} s]")
    return 0 if ok else 1
