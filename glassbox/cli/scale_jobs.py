"""``glassbox sweep``, ``glassbox attribute`` and ``glassbox evaluate``: jobs over a dataset of prompt pairs.

    glassbox sweep --model gpt2 --pairs ioi.jsonl --activation resid_pre --axes layer,pos --out sweep/
    glassbox attribute --model gpt2 --pairs ioi.jsonl --method atp --activation z --axes layer,head --out atp/
    glassbox attribute --model gpt2 --pairs ioi.jsonl --method EAP --out eap/ --ray --workers 2
    glassbox evaluate --model gpt2 --pairs ioi.jsonl --out eval/

``--pairs`` is a JSONL file (one object a line), a JSON list, or a ``datasets`` folder, with fields
``clean``, ``corrupted``, ``answer`` and ``distractor`` (text, or token ids); answers must be single
tokens. Pairs of different token lengths are batched by length. The output folder holds glassbox's
manifest.json, one folder per shard, and the result: ``result.safetensors`` and ``result.json`` (sweep,
atp), ``graph.json`` (EAP), ``eval.json`` (evaluate). ``--resume`` continues an interrupted job, keeping
the shards that verify. ``--ray`` needs ``ray``, a datasets folder ``datasets``: ``pip install -e '.[scale]'``.
"""

from pathlib import Path

from .common import positive_int
from .errors import UsageError, device_arg, user_errors
from .export import ray_requested, require_package

MODEL_DTYPES = ("float32", "float64", "float16", "bfloat16", "auto")
METRICS = ("logit_diff", "target_prob", "target_loss")
ATTRIBUTION_METHODS = ("atp", "atp*", "EAP", "EAP-IG-inputs", "EAP-IG-activations")


def _common(p, what: str) -> None:
    p.add_argument("--model", required=True, help="hub name, folder or shipped model")
    p.add_argument("--pairs", required=True, help="prompt pairs: a .jsonl / .json file or a datasets folder")
    p.add_argument("--out", required=True, help=f"the {what} folder (new or empty, or an earlier one with --resume)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="pairs per forward batch (default 8)")
    p.add_argument("--shard-size", type=positive_int, default=None,
                   help="pairs per shard, a multiple of --batch-size (default: 64 rounded to it)")
    p.add_argument("--no-bos", action="store_true", help="tokenize prompts without a BOS in front")
    p.add_argument("--device", default=None, type=device_arg, help="device of each model replica (default cpu)")
    p.add_argument("--dtype", default="float32", choices=MODEL_DTYPES, help="the model's dtype (default float32)")
    p.add_argument("--ray", action="store_true", help="run on a local Ray cluster, one model replica per worker")
    p.add_argument("--ray-address", default=None, help="join the Ray cluster at ADDR (implies --ray)")
    p.add_argument("--workers", type=positive_int, default=None, help="Ray workers (model replicas)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted job in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _nodes(p, required: bool) -> None:
    p.add_argument("--activation", required=required, default=None,
                   help="what to patch: resid_pre, attn_out, z, ... or a template with {L}; comma-separated stacks")
    p.add_argument("--axes", default="layer,pos", help="comma-separated axes, 'layer' first (default layer,pos)")
    p.add_argument("--metric", default="logit_diff", choices=METRICS,
                   help="read at the last position (default logit_diff: answer minus distractor)")


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="an activation-patching sweep over a dataset of prompt pairs")
    _common(p, "sweep")
    _nodes(p, required=True)
    p.add_argument("--memory-budget", type=positive_int, default=2**30, help="bytes one patching pass may use")
    p.set_defaults(func=run_sweep)

    p = sub.add_parser("attribute", help="attribution patching (AtP) or edge attribution (EAP) over prompt pairs")
    _common(p, "attribution")
    _nodes(p, required=False)
    p.add_argument("--method", default="atp", choices=ATTRIBUTION_METHODS,
                   help="atp / atp* (nodes: needs --activation) or EAP, EAP-IG-* (every edge); default atp")
    p.add_argument("--steps", type=positive_int, default=None, help="integration steps of EAP-IG (default 5)")
    p.set_defaults(func=run_attribute)

    p = sub.add_parser("evaluate", help="loss, logit difference and accuracy of a model over a dataset of prompts")
    _common(p, "evaluation")
    p.add_argument("--prompt", default="clean", choices=("clean", "corrupted"), help="which prompts (default clean)")
    p.set_defaults(func=run_evaluate)


def _backend(args) -> dict:
    use_ray = ray_requested(args)
    if Path(args.pairs).is_dir():
        require_package("datasets", "--pairs FOLDER (a datasets folder)")
    return {"batch_size": args.batch_size, "shard_size": args.shard_size, "device": args.device, "dtype": args.dtype,
            "prepend_bos": not args.no_bos, "backend": "ray" if use_ray else "local",
            "ray_address": args.ray_address, "n_workers": args.workers, "resume": args.resume,
            "progress": not args.no_progress}


def _names(value: str, flag: str) -> list:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UsageError(f"{flag} {value!r} names nothing")
    return names


def _activation(value):
    names = _names(value, "--activation")
    return names[0] if len(names) == 1 else names


ERRORS = (ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError, OSError)


def run_sweep(args) -> int:
    from ..scale.jobs_sweep import sweep

    options = _backend(args)
    with user_errors(*ERRORS):
        result = sweep(args.model, args.pairs, args.out, _activation(args.activation), _names(args.axes, "--axes"),
                       metric=args.metric, memory_budget=args.memory_budget, **options)
    _print_nodes(result, args.out)
    return 0


def run_attribute(args) -> int:
    from ..scale.jobs_attribution import ATP_METHODS, attribute, graph_summary

    options = _backend(args)
    node = args.method in ATP_METHODS
    if node and args.activation is None:
        raise UsageError(f"--method {args.method} attributes nodes: give --activation (e.g. z, resid_pre)")
    if not node and args.activation is not None:
        raise UsageError(f"--method {args.method} scores every edge; drop --activation")
    with user_errors(*ERRORS):
        result = attribute(args.model, args.pairs, args.out, _activation(args.activation) if node else None,
                           _names(args.axes, "--axes"), method=args.method, metric=args.metric, steps=args.steps,
                           **options)
    if node:
        _print_nodes(result, args.out)
    else:
        print(f"{args.method} over {result.metadata['n_prompts']} pairs: {result.n_edges} edges, graph written "
              f"to {Path(args.out) / 'graph.json'}; top edges:")
        print(graph_summary(result))
    return 0


def run_evaluate(args) -> int:
    from ..scale.jobs_eval import evaluate

    options = _backend(args)
    with user_errors(*ERRORS):
        result = evaluate(args.model, args.pairs, args.out, prompt=args.prompt, **options)
    print(f"evaluated {result['n_prompts']} {args.prompt} prompts ({Path(args.out) / 'eval.json'}):")
    for key, value in result.items():
        if key not in ("n_prompts", "prompt") and value is not None:
            print(f"  {key}: {value:.6g}" if isinstance(value, float) else f"  {key}: {value}")
    return 0


def _print_nodes(result, out) -> None:
    mean = result.mean
    print(f"{mean.name} over {result.n_prompts} pairs, metric {mean.metric}: mean clean "
          f"{float(result.clean.double().mean()):.5g}, corrupted {float(result.corrupted.double().mean()):.5g}; "
          f"result {tuple(mean.shape)} ({', '.join(mean.axes)}) written to {Path(out) / 'result.safetensors'}")
    flat = mean.values.reshape(-1)
    best = int(flat.abs().argmax()) if flat.numel() else 0
    index = []
    for size in reversed(mean.shape):
        index.append(best % size)
        best //= size
    index = index[::-1]
    where = ", ".join(f"{a}={mean.labels.get(a, [str(i) for i in range(n)])[i]}"
                      for a, i, n in zip(mean.axes, index, mean.shape))
    print(f"largest |value|: {float(mean.values[tuple(index)]):+.5g} at {where}")
