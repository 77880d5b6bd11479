"""``glassbox circuit``: find the edges behind one prediction, and check the circuit they make exactly.

    glassbox circuit --clean "Elizabeth read the letter. Then Elizabeth read the" \\
        --corrupted "Elizabeth read the garden. Then Elizabeth read the" \\
        --answer " letter" --distractor " garden" [--method EAP|EAP-IG --steps m --points GRID --top-k K
        --out DIR]
    glassbox circuit --pairs pairs.jsonl [...]     # many pairs: the JSONL the scale jobs read

``--pairs FILE`` takes the prompt pairs of the scale jobs (``glassbox.scale.jobs_data``: JSONL, JSON or a
datasets folder; fields clean, corrupted, answer, distractor, as text or token ids), all of one token
length; the metric is then the mean logit difference over the pairs. When the clean run does not
prefer the answer (its logit difference is <= 0) the command says so on stderr, and suggests the
spelling with a leading space where that is one token (``letter`` -> ``' letter'``); a word that is
not one token is refused with the same suggestion.

Sign convention: an edge's score estimates the change in the metric when that edge alone carries its
sender's corrupted value (score ~ m(edge corrupted) - m(clean)); a negative score (red) is an edge whose
clean value supports the answer, a positive one (blue) an edge that works against it.

The metric is the logit difference answer - distractor at the last position. Every edge (input,
heads, MLPs -> each head's q/k/v input, each MLP input, the logits) is scored by edge attribution
patching (EAP; EAP-IG averages the gradient over ``--steps`` interpolation steps, on the grid
``--points`` names: paper, the default, eap-ig-code or midpoint; see ``eap``). Circuits of the
top k edges are then evaluated exactly, for a sweep of sizes k: the clean input runs and every edge
outside the circuit carries its sender's corrupted value. Faithfulness is (m(circuit) -
m(corrupted)) / (m(clean) - m(corrupted)): 1 when the circuit alone restores the clean prediction.
The circuit written is the top ``--top-k`` edges, or, without ``--top-k``, the smallest swept size
whose faithfulness reaches 0.9 (the largest size when none does; the output says so).

Writes ``DIR/graph.json`` (``Graph.to_json``: every edge's score, the circuit, metadata with the
faithfulness curve) and ``DIR/circuit.html`` (the offline graph page), and prints the top edges, the
faithfulness at each size and the curve's CPR and CMD. Clean and corrupted prompts must have the same
number of tokens (edges are patched position by position); answer and distractor must be one token
each. A mistake in the arguments is one line, ``glassbox circuit: error: ...``, exit status 2.
"""

import json
import time

from .common import (load_model, make_folder, output_folder, positive_int, prompt_tokens, text_arg, tokenizer_of,
                     write_output)
from .errors import UsageError, device_arg, user_errors
from .help_values import DEFAULT_MODEL

METHODS = {"EAP": "EAP", "EAP-IG": "EAP-IG-inputs", "EAP-IG-inputs": "EAP-IG-inputs",
           "EAP-IG-activations": "EAP-IG-activations"}  # --method -> eap()'s method
DTYPES = ("float32", "float64", "bfloat16", "float16")
DEFAULT_STEPS = 5  # EAP-IG's interpolation steps when --steps is not given
POINTS = ("paper", "eap-ig-code", "midpoint")  # eap's grids (eap.POINTS; not imported, so --help stays light)
TARGET = 0.9       # the faithfulness the circuit chosen without --top-k must reach
OUTPUTS = ("graph.json", "circuit.html")


def add_parser(sub) -> None:
    p = sub.add_parser("circuit", help="score every edge (EAP, EAP-IG), then evaluate the top-k circuit exactly",
                       description="Score every edge between the input, heads, MLPs and logits by edge attribution "
                       "patching, evaluate circuits of the best edges exactly for a sweep of sizes, and write "
                       "graph.json and circuit.html. A mistake in the arguments is one line and exit status 2.")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"hub name (gpt2, ...; from the hub or the local Hugging Face cache), folder or shipped model "
                        f"(default {DEFAULT_MODEL}); needs sequential pre-norm blocks")
    p.add_argument("--clean", type=text_arg, default=None, help="the prompt whose prediction the circuit explains")
    p.add_argument("--corrupted", type=text_arg, default=None,
                   help="the same prompt with something changed; as many tokens as --clean")
    p.add_argument("--answer", type=text_arg, default=None, help="one token: the clean prompt's next token")
    p.add_argument("--distractor", type=text_arg, default=None,
                   help="one token: what the corrupted prompt predicts instead")
    p.add_argument("--pairs", default=None, metavar="FILE",
                   help="prompt pairs instead of --clean/--corrupted/--answer/--distractor: the JSONL (or JSON, or "
                        "datasets folder) the scale jobs read, every pair of one token length; the metric is the "
                        "mean logit difference")
    p.add_argument("--method", choices=tuple(METHODS), default="EAP-IG",
                   help="EAP (one gradient), or EAP-IG (default; the gradient averaged over --steps points between "
                        "the clean and corrupted embeddings, = EAP-IG-inputs), or EAP-IG-activations (per sender, "
                        "n_senders times the cost)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"EAP-IG's interpolation steps (default {DEFAULT_STEPS}); not for EAP")
    p.add_argument("--points", choices=POINTS, default=None,
                   help="EAP-IG's grid: paper (default; alpha = k/m, k = 1..m, from the corrupted input at 0 to the "
                        "clean one), eap-ig-code (k = 0..m-1, the EAP-IG code's) or midpoint; not for EAP")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help=f"edges in the circuit written (default: the smallest swept size with faithfulness >= "
                        f"{TARGET})")
    p.add_argument("--out", default="glassbox-circuit",
                   help="output folder, created if needed (default glassbox-circuit)")
    p.add_argument("--max-edges", type=positive_int, default=200,
                   help="most edges drawn on the page (the circuit's first; default 200)")
    p.add_argument("--device", default=None, type=device_arg, help="e.g. cuda; default: cpu")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="precision of the model (default float32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


STEPS_PER_DECADE = (1, 1.5, 2, 3, 5, 7)


def sweep_sizes(n_edges: int, top_k=None) -> list:
    """Circuit sizes 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, ... below n_edges, then n_edges itself,
    and ``top_k``."""
    sizes, base = set(), 1
    while base < n_edges:
        sizes.update(int(s * base) for s in STEPS_PER_DECADE if 1 <= int(s * base) < n_edges)
        base *= 10
    sizes.add(n_edges)
    if top_k is not None:
        sizes.add(top_k)
    return sorted(sizes)


FLAGS = ("--clean", "--corrupted", "--answer", "--distractor")


def check_arguments(args, model) -> tuple:
    """(clean [batch pos], corrupted [batch pos], answer id(s), distractor id(s)), or a UsageError naming
    the argument: one pair from the four flags (ids are ints), or ``--pairs`` (ids are [batch] tensors)."""
    if args.method == "EAP" and args.steps not in (None, 1):
        raise UsageError(f"--steps {args.steps} is for EAP-IG (EAP takes one gradient); drop --steps or give "
                         "--method EAP-IG")
    if args.method == "EAP" and args.points is not None:
        raise UsageError(f"--points {args.points} is for EAP-IG (EAP takes one gradient, at the clean run); drop "
                         "--points or give --method EAP-IG")
    given = [flag for flag in FLAGS if getattr(args, flag[2:]) is not None]
    if args.pairs is not None:
        if given:
            raise UsageError(f"--pairs {args.pairs!r} gives the prompts, answers and distractors; drop "
                             f"{', '.join(given)}")
        return pairs_arguments(args.pairs, model)
    missing = [flag for flag in FLAGS if flag not in given]
    if missing:
        raise UsageError(f"give {', '.join(missing)} (one prompt pair), or --pairs FILE")
    clean = prompt_tokens(model, args.clean, flag="--clean")
    corrupted = prompt_tokens(model, args.corrupted, flag="--corrupted")
    if clean.shape != corrupted.shape:
        bos = " (BOS included)" if model.cfg.default_prepend_bos else ""
        raise UsageError(f"--clean is {clean.shape[1]} tokens and --corrupted {corrupted.shape[1]}{bos}; they must "
                         "have the same number of tokens, since each edge is patched position by position")
    if bool((clean == corrupted).all()):
        raise UsageError("--corrupted has the same tokens as --clean; change what the circuit should explain "
                         "(e.g. the word the answer repeats)")
    ids = {}
    for flag, value in (("--answer", args.answer), ("--distractor", args.distractor)):
        why = one_token_problem(model, value)
        if why:
            raise UsageError(f"{flag} {value!r} {why}")
        ids[flag] = token_id(model, value)
    if ids["--answer"] == ids["--distractor"]:
        raise UsageError(f"--distractor {args.distractor!r} is the same token as --answer; the logit difference "
                         "would be 0 on every run")
    return clean, corrupted, ids["--answer"], ids["--distractor"]


def token_id(model, text: str) -> int:
    from .demo import token_id as first_id

    return first_id(model, text)


def spaced(model, text: str):
    """``' ' + text`` when that is one ordinary token and ``text`` has no leading space, else None."""
    from .demo import not_one_token

    if text.startswith(" ") or not text.strip():
        return None
    return " " + text if not not_one_token(model, " " + text) else None


def one_token_problem(model, text: str):
    """Why ``text`` cannot be an answer or distractor (with the spelling that can, where a leading space
    makes it one token), or None."""
    from .demo import not_one_token

    why = not_one_token(model, text)
    if not why:
        return None
    better = spaced(model, text)
    return why + (f"; did you mean {better!r} (with a leading space, one token)?" if better else
                  "; give a single-token word")


def pairs_arguments(path: str, model) -> tuple:
    from ..scale.jobs_data import load_pairs

    import torch

    try:
        pairs = load_pairs(path, model.tokenizer, prepend_bos=model.cfg.default_prepend_bos, required=FLAGS_FIELDS)
        pairs.check_one_length("glassbox circuit")
        pairs.check_vocab(model.cfg.d_vocab)
        pairs.check_context(model.cfg.n_ctx)
    except (ValueError, FileNotFoundError, ImportError) as error:
        raise UsageError(f"--pairs {path!r}: {str(error).splitlines()[0]}") from error
    for i, (a, d) in enumerate(zip(pairs.answer, pairs.distractor)):
        if a == d:
            raise UsageError(f"--pairs {path!r}: {pairs.names[i]} has the same token as answer and distractor; the "
                             "logit difference would be 0 on every run")
    device = model.W_U.device
    clean = torch.tensor(pairs.clean, device=device)
    corrupted = torch.tensor(pairs.corrupted, device=device)
    if bool((clean == corrupted).all()):
        raise UsageError(f"--pairs {path!r}: every pair's corrupted prompt has the same tokens as its clean one")
    return clean, corrupted, torch.tensor(pairs.answer, device=device), torch.tensor(pairs.distractor, device=device)


FLAGS_FIELDS = ("clean", "corrupted", "answer", "distractor")


def warn_if_not_preferred(found, args, model, out=None) -> None:
    """Say on stderr when the clean run does not prefer the answer: the circuit then explains a
    preference for the distractor, or nothing."""
    import sys

    clean = float(found.sweep.full)  # the exact clean run's (mean) logit difference
    if clean > 0:
        return
    what = (f"the mean logit difference over --pairs {args.pairs!r}" if args.pairs is not None else
            f"the logit difference --answer {args.answer!r} - --distractor {args.distractor!r}")
    hint = ""
    if args.pairs is None:
        better = [(flag, spaced(model, value)) for flag, value in (("--answer", args.answer),
                                                                   ("--distractor", args.distractor))]
        better = [f"{flag} {b!r}" for flag, b in better if b is not None]
        if better:
            hint = f"; did you mean {' '.join(better)} (a leading space, as the word follows a space in the prompt)?"
    print(f"glassbox circuit: warning: {what} is {clean:.4g} on the clean run, so the clean run does not prefer "
          f"the answer and the circuit found explains no preference for it{hint}", file=out or sys.stderr)


def run(args) -> int:
    import torch

    from ..interp.attribution import edges

    out = output_folder(args.out)
    for name in OUTPUTS:
        if (out / name).is_dir():
            raise UsageError(f"--out {args.out!r} holds a folder named {name}, where this command writes a file; "
                             "give another folder")
    model = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    tokenizer_of(model, args.model)
    clean, corrupted, answer, distractor = check_arguments(args, model)
    n_edges = int(edges.edge_mask_for(edges.senders(model.cfg), edges.receivers(model.cfg)).sum())
    if args.top_k is not None and args.top_k > n_edges:
        raise UsageError(f"--top-k {args.top_k} is more than this model's {n_edges} edges; give at most {n_edges}")
    steps = (args.steps or DEFAULT_STEPS) if args.method != "EAP" else 1
    found = find_circuit(model, args.model, clean, corrupted, answer, distractor, args.method, steps, args.top_k,
                         progress=not args.no_progress, points=args.points or "paper")
    if args.pairs is not None:
        found.graph.metadata.update(pairs=str(args.pairs), n_pairs=int(clean.shape[0]))
    else:
        found.graph.metadata.update(clean=args.clean, corrupted=args.corrupted)
    warn_if_not_preferred(found, args, model)
    make_folder(out, args.out)
    write_outputs(found, out, args)
    print(summary(found, args))
    return 0


class Found:
    """What ``find_circuit`` found: the scored graph with its circuit chosen, the exact sweep over edge
    counts (``sweep``) and the one over MIB's fractions of edges (``mib``, for CPR and CMD)."""

    def __init__(self, graph, sweep, mib, chosen: int, reached: bool, seconds: float):
        self.graph, self.sweep, self.mib = graph, sweep, mib
        self.chosen, self.reached, self.seconds = chosen, reached, seconds
        self.faithfulness = dict(zip(sweep.sizes, sweep.faithfulness.tolist()))  # edge count -> faithfulness


def find_circuit(model, name, clean, corrupted, answer, distractor, method: str, steps: int, top_k,
                 progress: bool, points: str = "paper") -> Found:
    """Score every edge, evaluate the top-k circuits exactly over ``sweep_sizes`` and MIB's fractions,
    and choose the circuit. ``answer`` and ``distractor`` are token ids: ints for one pair, [batch]
    tensors for ``--pairs`` (the metric is then the mean over the pairs); (``top_k``, or the smallest swept size reaching ``TARGET``)."""
    from ..interp.attribution.eap import eap
    from ..interp.attribution.eap_setup import check_edge_model
    from ..interp.attribution.faithfulness import MIB_FRACTIONS, faithfulness_curve
    from ..interp.patching import LogitDiff

    start = time.perf_counter()
    metric = LogitDiff(answer, distractor)
    with user_errors(ValueError, prefix=f"--model {name!r}: "):
        check_edge_model(model)
    graph = eap(model, clean, corrupted, metric, method=METHODS[method], steps=steps if method != "EAP" else None,
                progress=progress, points=points)
    clean_metric, corrupted_metric = graph.metadata["metric_clean"], graph.metadata["metric_corrupted"]
    if clean_metric == corrupted_metric:
        raise UsageError(f"the logit difference is {clean_metric:.6g} on both --clean and --corrupted; faithfulness "
                         "(m(circuit) - m(corrupted)) / (m(clean) - m(corrupted)) is then undefined, so choose a "
                         "corruption that changes the prediction")
    try:
        sweep = faithfulness_curve(model, graph, clean, corrupted, metric, sizes=sweep_sizes(graph.n_edges, top_k),
                                   progress=progress)
        mib = faithfulness_curve(model, graph, clean, corrupted, metric, sizes=MIB_FRACTIONS, progress=progress)
    except ValueError as error:
        if "faithfulness is undefined" not in str(error):
            raise
        raise UsageError(f"{str(error).splitlines()[0]}; choose a corruption that moves the logit difference more, "
                         "or a wider --dtype") from error
    if top_k is not None:
        chosen = top_k
        reached = dict(zip(sweep.sizes, sweep.faithfulness.tolist()))[top_k] >= TARGET
    else:
        smallest = sweep.smallest_size(TARGET)
        chosen, reached = (smallest, True) if smallest is not None else (sweep.sizes[-1], False)
    circuit = graph.top_k(chosen)
    circuit.metadata.update({
        "circuit_size": chosen, "circuit_faithfulness": dict(zip(sweep.sizes, sweep.faithfulness.tolist()))[chosen],
        "faithfulness_by_size": sweep.as_dict(), "faithfulness_mib": mib.as_dict(), "CPR": mib.cpr, "CMD": mib.cmd,
        **({"answer": model.tokenizer.decode([answer]), "distractor": model.tokenizer.decode([distractor])}
           if isinstance(answer, int) else {})})
    return Found(circuit, sweep, mib, chosen, reached, time.perf_counter() - start)


def write_outputs(found: Found, out, args) -> None:
    from ..interp.plots.graph import circuit_page

    write_output(out / "graph.json", args.out, json.dumps(found.graph.to_json(), allow_nan=False))
    meta = found.graph.metadata
    page = circuit_page(found.graph, title=f"circuit of {meta.get('model', args.model)}: {task(args, found)}",
                        max_edges=args.max_edges,
                        faithfulness=found.faithfulness[found.chosen], curve=found.faithfulness)
    write_output(out / "circuit.html", args.out, page)


def task(args, found) -> str:
    if args.pairs is not None:
        return f"{found.graph.metadata.get('n_pairs')} pairs of {args.pairs}"
    return f"{args.answer!r} over {args.distractor!r}"


SIGN = ("an edge's score estimates the change in the metric when that edge alone carries its sender's corrupted "
        "value: negative = its clean value supports the answer, positive = it works against it")


def summary(found: Found, args, n_top: int = 10) -> str:
    graph, meta = found.graph, found.graph.metadata
    cfg = meta.get("cfg", {})
    steps = f" ({meta['steps']} steps, {meta['points']} grid)" if meta.get("steps") else ""
    lines = [f"model {meta.get('model')}: {cfg.get('n_layers')} layers x {cfg.get('n_heads')} heads; "
             f"{graph.n_edges:,} edges scored by {meta['method']}{steps}",
             (f"mean logit difference answer - distractor over {meta.get('n_pairs')} pairs" if args.pairs is not None
              else f"logit difference {args.answer!r} - {args.distractor!r}")
             + f": clean {found.sweep.full:.4f}, corrupted {found.sweep.empty:.4f} (exact evaluation)", "",
             f"top {min(n_top, graph.n_edges)} edges ({SIGN}):"]
    edges = graph.edges()[:n_top]
    width = max((len(f"{s} -> {r}") for s, r, _ in edges), default=0)
    lines += [f"  {f'{s} -> {r}':<{width}}  {score:+.4f}" for s, r, score in edges]
    lines += ["", "faithfulness of the top-k circuit (exact evaluation):", f"  {'k':>7}  faithfulness"]
    lines += [f"  {k:>7,}  {round(found.faithfulness[k], 4) + 0.0:12.4f}" + ("  <- chosen" if k == found.chosen else "")
              for k in found.sweep.sizes]
    fractions = ", ".join(f"{100 * x:g}%" for x in found.mib.fractions)
    lines.append(f"  over MIB's sizes ({fractions} of the edges: {', '.join(map(str, found.mib.sizes))} edges):")
    lines.append(f"  CPR {found.mib.cpr:.4f} (area under faithfulness; higher is better), "
                 f"CMD {found.mib.cmd:.4f} (area under |1 - faithfulness|; lower is better)")
    if args.top_k is not None:
        why = f"--top-k {args.top_k}"
    elif found.reached:
        why = f"the smallest swept size with faithfulness >= {TARGET}"
    else:
        why = f"no swept size reached faithfulness {TARGET}, so the largest"
    nodes = graph.nodes_in_circuit()
    lines += ["", f"circuit: the top {found.chosen:,} edges ({why}), faithfulness "
              f"{found.faithfulness[found.chosen]:.4f}; {len(nodes)} nodes: {', '.join(nodes[:20])}"
              + (" ..." if len(nodes) > 20 else ""),
              f"wrote {args.out}/graph.json and {args.out}/circuit.html in {found.seconds:.1f} s"]
    return "\n".join(lines)
