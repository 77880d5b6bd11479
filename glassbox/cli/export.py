"""``glassbox export``: cache chosen hooks over a corpus into SAELens's cached-activations layout.

    glassbox export --model gpt2 --text corpus.txt --hooks blocks.6.hook_resid_post --out acts/
    glassbox export --model gpt2 --dataset tokens/ --hooks blocks.6.hook_resid_post --out acts/ --ray --workers 2

``--text`` is one token stream cut into windows of ``--context-size`` tokens with a BOS each;
``--dataset`` is a pretokenized ``datasets`` folder (``input_ids`` or ``tokens``). The export (a
``datasets`` folder, plus glassbox's manifest.json) is read by ``datasets.load_from_disk`` and by SAELens
training via ``cached_activations_path``. ``--resume`` continues an interrupted export, keeping the shards
that verify. Needs ``datasets`` (and ``ray`` for ``--ray``): ``pip install -e '.[scale]'``.
"""

import importlib

from .common import positive_int
from .errors import UsageError, device_arg, user_errors

MODEL_DTYPES = ("float32", "float64", "float16", "bfloat16", "auto")
INSTALL = "pip install -e '.[scale]'"


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="cache hooks over a corpus into SAELens's cached-activations layout")
    p.add_argument("--model", required=True, help="hub name, folder or shipped model")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="a UTF-8 text file, encoded as one stream and cut into windows")
    source.add_argument("--dataset", help="a pretokenized datasets folder (save_to_disk) with input_ids or tokens")
    p.add_argument("--hooks", required=True, help="comma-separated hook names, e.g. blocks.3.hook_resid_post")
    p.add_argument("--out", required=True, help="the export folder (new or empty, or an earlier export with --resume)")
    p.add_argument("--context-size", type=positive_int, default=None,
                   help="tokens per window, BOS included (default 128 for --text; a dataset's row length)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="windows per forward pass (default 8)")
    p.add_argument("--shard-size", type=positive_int, default=None,
                   help="windows per shard, a multiple of --batch-size (default: 256 rounded to it)")
    p.add_argument("--act-dtype", default="float32", choices=("float32", "float16", "float64"),
                   help="dtype of the stored activations (default float32)")
    p.add_argument("--device", default=None, type=device_arg, help="device of each model replica (default cpu)")
    p.add_argument("--dtype", default="float32", choices=MODEL_DTYPES, help="the model's dtype (default float32)")
    p.add_argument("--ray", action="store_true", help="run on a local Ray cluster, one model replica per worker")
    p.add_argument("--ray-address", default=None, help="join the Ray cluster at ADDR (implies --ray)")
    p.add_argument("--workers", type=positive_int, default=None, help="Ray workers (model replicas)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted export in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def require_package(module: str, flag: str) -> None:
    """A usage error naming the scale extra when ``module`` (ray, datasets) is not installed."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{flag} needs the Python package {module!r}, which is not installed: {INSTALL}") from None


def ray_requested(args) -> bool:
    """Whether --ray or --ray-address asks for Ray (then installed); --workers needs one of them."""
    use_ray = args.ray or args.ray_address is not None
    if args.workers is not None and not use_ray:
        raise UsageError("--workers needs --ray (or --ray-address)")
    if use_ray:
        require_package("ray", "--ray")
    return use_ray


def run(args) -> int:
    hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
    if not hooks:
        raise UsageError(f"--hooks {args.hooks!r} names no hook; give e.g. blocks.0.hook_resid_post")
    use_ray = ray_requested(args)
    require_package("datasets", "export (it writes Arrow)")
    from ..scale.export import export

    with user_errors(ValueError, KeyError, FileNotFoundError, FileExistsError, NotADirectoryError, OSError):
        out = export(args.model, args.out, hooks, text=args.text, dataset=args.dataset,
                     context_size=args.context_size, batch_size=args.batch_size, shard_size=args.shard_size,
                     act_dtype=args.act_dtype, device=args.device, dtype=args.dtype,
                     backend="ray" if use_ray else "local", ray_address=args.ray_address, n_workers=args.workers,
                     resume=args.resume, progress=not args.no_progress)
    from ..scale.manifest import load_manifest

    manifest = load_manifest(out)
    rows = sum(e["rows"] for e in manifest["shards"].values())
    context = manifest["params"]["context_size"]
    print(f"exported {rows} windows x {context} tokens ({rows * context} tokens), hooks {', '.join(hooks)}, "
          f"in {len(manifest['plan'])} shards to {out}")
    return 0
