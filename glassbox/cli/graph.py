"""``glassbox graph``: the attribution graph of one prompt over a transcoder set, its files and its page.

    glassbox graph --model glassbox-austen --transcoders NAME_OR_DIR --prompt "..." [--out DIR] [--node-threshold 0.8]
        [--edge-threshold 0.98] [--max-logits 10] [--logit-prob 0.95] [--batch-size 64] [--device cuda]
        [--contexts-text FILE] [--contexts-tokens 4096]

``--transcoders`` is a shipped set's name (``glassbox-austen-plt``, ``glassbox-austen-clt``), a folder in
circuit-tracer's layout (``config.yaml``) or a folder of SAELens transcoder folders (one per layer). Writes into ``--out`` (default glassbox-graph; a user's other files there are kept):
``attribution_graph.safetensors`` + ``attribution_graph.json`` (the whole graph, ``load_graph`` reads it),
``graph.json`` + ``graph-metadata.json`` (circuit-tracer's viewer format, pruned) and ``graph.html`` (the
offline page: clicking a feature shows its top-activating contexts and logit effects, computed on
``--contexts-text``, by default the held-out last 5% of data/austen.txt in a source checkout, the first
``--contexts-tokens`` tokens of it; without that file, and with no ``--contexts-text``, the page has no
contexts and says so), and prints the graph's size, the kept share of influence and the top paths to the top logit.
A mistake in the arguments is one line, ``glassbox graph: error: ...``, exit status 2.
"""

from .common import load_model, output_folder, positive_int, prompt_tokens, text_arg
from .errors import UsageError, device_arg
from .help_values import DEFAULT_MODEL

OUTPUTS = ("attribution_graph.safetensors", "attribution_graph.json", "graph.json", "graph-metadata.json",
           "graph.html")


def share(value: str) -> float:
    import argparse

    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1]")
    return v


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="attribution graph of a prompt over transcoder features (circuit tracing)",
                       description="Compute the exact attribution graph of a prompt over a transcoder set, prune "
                       "it by influence, write its files and an offline page, and print the top paths.")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"hub name, folder or shipped model (default {DEFAULT_MODEL})")
    p.add_argument("--transcoders", required=True,
                   help="a shipped set (glassbox-austen-plt, glassbox-austen-clt) or a transcoder folder: "
                   "circuit-tracer's layout (config.yaml) or SAELens transcoder folders")
    p.add_argument("--prompt", type=text_arg, required=True, help="the prompt; the graph explains its next token")
    p.add_argument("--out", default="glassbox-graph", help="output folder (default glassbox-graph)")
    p.add_argument("--node-threshold", type=share, default=0.8, help="share of node influence kept (default 0.8)")
    p.add_argument("--edge-threshold", type=share, default=0.98, help="share of edge influence kept (default 0.98)")
    p.add_argument("--max-logits", type=positive_int, default=10, help="most logit nodes (default 10)")
    p.add_argument("--logit-prob", type=share, default=0.95,
                   help="logit nodes until this cumulative probability (default 0.95)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="targets per backward pass (default 64)")
    p.add_argument("--contexts-text", default=None, metavar="FILE",
                   help="UTF-8 text on which the page finds each feature's top-activating contexts (default: the "
                   "held-out last 5%% of data/austen.txt, in a source checkout)")
    p.add_argument("--contexts-tokens", type=positive_int, default=4096,
                   help="use the first windows of the text holding this many tokens (default 4096)")
    p.add_argument("--device", default=None, type=device_arg, help="e.g. cuda; default: cpu")
    p.set_defaults(func=run)


def load_transcoders(name: str, device):
    from ..interp.transcoders import load_transcoders as load

    try:
        return load(name, device=device)
    except (ValueError, FileNotFoundError, KeyError) as e:
        raise UsageError(f"--transcoders {name!r}: {str(e).splitlines()[0]}") from e


def contexts_text(path):
    """(the text for the features' contexts or None, a few words on it)."""
    from pathlib import Path

    if path is None:
        from ..train.data import split_text
        from .demo import HELDOUT_FRAC

        default = Path(__file__).resolve().parents[2] / "data" / "austen.txt"
        if not default.is_file():
            return None, f"no {default} (a source checkout has it) and no --contexts-text"
        return split_text(default.read_text(encoding="utf-8"), HELDOUT_FRAC)[1], "held-out data/austen.txt"
    file = Path(path).expanduser()
    if not file.is_file():
        raise UsageError(f"--contexts-text {path!r}: no such file")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--contexts-text {path!r} is not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise UsageError(f"--contexts-text {path!r} is empty")
    return text, file.name


def run(args) -> int:
    from ..interp.graphs import attribute
    from ..interp.graphs.export import frontend_json, save_graph
    from ..interp.graphs.page import graph_page
    from ..interp.graphs.paths import node_label, top_paths
    from ..interp.graphs.prune import prune_graph

    out = output_folder(args.out)
    for name in OUTPUTS:
        if (out / name).is_dir():
            raise UsageError(f"--out {args.out!r} holds a folder named {name}, where this command writes a file")
    text, text_note = contexts_text(args.contexts_text)
    model = load_model(args.model, device=args.device)
    ts = load_transcoders(args.transcoders, args.device)
    try:
        ts.check_fits(model)
    except (ValueError, KeyError) as e:
        raise UsageError(f"--transcoders {args.transcoders!r} does not fit --model {args.model!r}: "
                         f"{str(e).splitlines()[0]}") from e
    tokens = prompt_tokens(model, args.prompt)[0]
    if len(tokens) < 2:
        raise UsageError("--prompt needs at least one token after the first position (which has no feature nodes)")
    graph = attribute(model, ts, tokens, max_n_logits=args.max_logits, desired_logit_prob=args.logit_prob,
                      batch_size=args.batch_size)
    pruned = prune_graph(graph, args.node_threshold, args.edge_threshold)
    token_strings = [model.tokenizer.decode([t]) for t in graph.tokens.tolist()]
    logit_strings = [model.tokenizer.decode([t]) for t in graph.logit_tokens.tolist()]
    data = frontend_json(graph, pruned, slug="graph", prompt=args.prompt, token_strings=token_strings,
                         logit_strings=logit_strings, node_threshold=args.node_threshold)
    details = None
    if text is not None:
        from ..interp.graphs.details import feature_details

        try:
            details = feature_details(model, ts, data, text, max_tokens=args.contexts_tokens)
        except ValueError as e:
            raise UsageError(f"feature contexts on {text_note}: {str(e).splitlines()[0]}") from e
        text_note = f"{text_note}, first {args.contexts_tokens} tokens (whole windows)"
    else:
        print(f"the page has no feature contexts: {text_note}")
    page = graph_page(data, graph.n_layers, title=f"attribution graph: {args.prompt[:60]}", details=details,
                      details_text=text_note)
    save_graph(graph, out, frontend=data, pages={"graph.html": page})
    kept = int(pruned.node_mask.sum())
    print(f"{graph.n_features} active features, {graph.n_nodes} nodes, {int((graph.adjacency != 0).sum())} nonzero "
          f"edges; pruned to {kept} nodes and {int(pruned.edge_mask.sum())} edges, {pruned.kept_influence:.3f} of "
          f"the node influence")
    print(f"top logit {logit_strings[0]!r} (p={float(graph.logit_probabilities[0]):.3f}); top paths into it:")
    mask = (pruned.edge_mask & pruned.node_mask[:, None] & pruned.node_mask[None, :]).to(graph.adjacency.dtype)
    for score, path in top_paths(graph, 0, k=5, mask=mask):
        print(f"  {score:.4f}  " + " -> ".join(node_label(graph, i, token_strings, logit_strings) for i in path))
    print(f"wrote {out}/graph.html, graph.json (circuit-tracer's viewer format) and attribution_graph.*")
    return 0
