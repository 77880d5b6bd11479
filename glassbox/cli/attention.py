"""``glassbox attention``: write an offline page showing every layer's and head's attention pattern.

    glassbox attention --model NAME_OR_PATH --prompt "..." --out view.html

Without ``--model`` the page shows the shipped model (glassbox-austen); ``--model random`` shows a
seeded random tiny GPT-2 (with GPT-2's tokenizer): useful to try the viewer, meaningless as a model.
"""

from .common import (load_model, output_file, positive_int, prompt_tokens, seed_arg, text_arg, tokenizer_of,
                     write_output)
from .errors import UsageError, device_arg
from .help_values import DEFAULT_MODEL

TINY = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=50257, n_ctx=256)


def add_parser(sub) -> None:
    p = sub.add_parser("attention", help="write an offline HTML viewer of a prompt's attention patterns")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"hub name (gpt2, ...; from the hub or the local Hugging Face cache), folder, shipped model "
                        f"(default {DEFAULT_MODEL}), or 'random' for a seeded random tiny GPT-2")
    p.add_argument("--prompt", type=text_arg, required=True,
                   help="the text whose attention is shown (at most the model's n_ctx tokens)")
    p.add_argument("--out", default="attention.html",
                   help="HTML file to write, replaced if it exists (default attention.html)")
    p.add_argument("--no-bos", action="store_true", help="do not prepend the BOS token")
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="refuse longer prompts (the page holds layers x heads x tokens^2 values; default 256)")
    p.add_argument("--device", default=None, type=device_arg, help="e.g. cuda; default: cpu")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the random model (--model random; default 0)")
    p.set_defaults(func=run)


def build_model(name, device, seed: int):
    import torch

    from ..models import Config, HookedTransformer
    from ..models.init import init_weights

    if name not in (None, "random"):
        return load_model(name, device=device, also_accepted="'random'")
    cfg = Config(**TINY, model_name="random tiny gpt2")
    model = HookedTransformer(cfg, init=False, device=device)
    init_weights(model, cfg, generator=torch.Generator(device=model.cfg_device()).manual_seed(seed))
    return model.eval()


def patterns_of(model, tokens):
    """[layer head query_pos key_pos] attention patterns of one prompt."""
    import torch

    names = [f"blocks.{L}.attn.hook_pattern" for L in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return torch.stack([cache[name][0] for name in names])


def run(args) -> int:
    from ..interp.plots import attention_viewer_html

    out = output_file(args.out)
    model = build_model(args.model, args.device, args.seed)
    tokenizer_of(model, args.model)
    tokens = prompt_tokens(model, args.prompt, prepend_bos=False if args.no_bos else None)
    labels = model.to_str_tokens(tokens[0])
    if len(labels) > args.max_tokens:
        raise UsageError(f"--prompt is {len(labels)} tokens, more than --max-tokens={args.max_tokens} (the page "
                         f"would hold {model.cfg.n_layers * model.cfg.n_heads * len(labels) ** 2:,} values); "
                         "shorten the prompt or raise --max-tokens")
    page = attention_viewer_html(patterns_of(model, tokens), labels,
                                 title=f"attention of {model.cfg.model_name}: {len(labels)} tokens")
    write_output(out, args.out, page)
    print(f"wrote {out} ({model.cfg.n_layers} layers x {model.cfg.n_heads} heads, {len(labels)} tokens)")
    return 0
