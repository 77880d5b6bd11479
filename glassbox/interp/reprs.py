"""Short reprs and notebook views (``_repr_html_``) of what people print: an activation cache, a
patching result, an attribution graph, an SAE and a model.

Each view is a small self-contained HTML fragment (tables with inline CSS): no script, no network, no
plotly.js, so it renders offline and in a notebook saved as HTML. Every value is read from the
object when it is shown, and every name is HTML-escaped (token labels hold ``<``, ``&``).

Footguns: a patching result's heatmap is drawn for results of one or two axes only (select an index
of the others first: ``result.select("component", 0)``), and shows at most ``MAX_CELLS`` rows and
columns, saying what it left out; values print with 3 significant digits (the tensor has them all).
"""

import html
from collections import OrderedDict

import torch

from ..models.hook_flags import FLAG_NAMES

MAX_CELLS = 64  # rows and columns a heatmap shows at most
TOP_EDGES = 10  # edges a graph's view lists
STYLE = "border-collapse:collapse;font:12px monospace;margin:2px 0"
CELL = "border:1px solid #ddd;padding:1px 4px;text-align:left"


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def table(rows, header=None, title: str = "") -> str:
    """An HTML table of ``rows`` (sequences of cells, each shown as str and escaped) under ``title``."""
    head = "".join(f'<th style="{CELL}">{esc(h)}</th>' for h in header) if header else ""
    body = "".join("<tr>" + "".join(f'<td style="{CELL}">{esc(c)}</td>' for c in row) + "</tr>" for row in rows)
    caption = f"<b>{esc(title)}</b>" if title else ""
    return f'<div>{caption}<table style="{STYLE}">{"<tr>" + head + "</tr>" if head else ""}{body}</table></div>'


def mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.2f} MiB"


# -- activation cache -------------------------------------------------------------------------------

def cache_groups(cache) -> "OrderedDict[str, list]":
    """The cache's keys grouped by where they live: ``blocks.{L}`` for each layer, in layer order, and
    ``model`` for the others (embeddings, the final norm, the unembedding), in the cache's order."""
    groups = OrderedDict()
    outside, layers = [], {}
    for key in cache.keys():
        parts = key.split(".")
        if parts[0] == "blocks" and len(parts) > 2 and parts[1].isdigit():
            layers.setdefault(int(parts[1]), []).append(key)
        else:
            outside.append(key)
    if outside:
        groups["model"] = outside
    for layer in sorted(layers):
        groups[f"blocks.{layer}"] = layers[layer]
    return groups


def cache_repr(cache) -> str:
    groups = cache_groups(cache)
    n_layers = sum(g.startswith("blocks.") for g in groups)
    return (f"ActivationCache({len(cache)} activations: {n_layers} layers, {len(groups.get('model', []))} outside "
            f"the blocks; {mib(cache.nbytes)})")


def cache_html(cache) -> str:
    rows = []
    for group, keys in cache_groups(cache).items():
        prefix = group + "." if group != "model" else ""
        names = ", ".join(f"{k[len(prefix):]} {list(cache[k].shape)}" for k in keys)
        size = sum(cache[k].numel() * cache[k].element_size() for k in keys)
        rows.append((group, len(keys), names, mib(size)))
    return table(rows, ("where", "keys", "activations [shape]", "size"), cache_repr(cache))


# -- patching result ----------------------------------------------------------------------------------

def cell_colour(value: float, scale: float) -> str:
    """Diverging colour centred on zero: red above, blue below, white at 0; grey for NaN."""
    if value != value:
        return "#bbbbbb"
    t = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    fade = round(255 * (1 - abs(t)))
    return f"rgb(255,{fade},{fade})" if t >= 0 else f"rgb({fade},{fade},255)"


def patch_html(result) -> str:
    values = result.values.detach().to("cpu", torch.float64)
    title = repr(result)
    if values.ndim == 0 or values.ndim > 2:
        note = (f"a heatmap shows one or two axes; this result has {values.ndim} ({', '.join(result.axes)}): "
                "select an index of the others first, e.g. result.select(axis, 0)")
        finite = values[torch.isfinite(values)]
        span = (f"{float(finite.min()):.3g} .. {float(finite.max()):.3g}" if finite.numel() else "no finite values")
        return table([("shape", " x ".join(map(str, values.shape))), ("range", span), ("note", note)], title=title)
    grid = values.reshape(1, -1) if values.ndim == 1 else values
    row_axis, col_axis = (None, result.axes[0]) if values.ndim == 1 else result.axes
    row_labels = result.labels.get(row_axis, [str(i) for i in range(grid.shape[0])]) if row_axis else [""]
    col_labels = result.labels.get(col_axis, [str(i) for i in range(grid.shape[1])])
    n_rows, n_cols = min(grid.shape[0], MAX_CELLS), min(grid.shape[1], MAX_CELLS)
    finite = grid[torch.isfinite(grid)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    corner = f"{row_axis or ''} \\ {col_axis}"
    head = f'<th style="{CELL}">{esc(corner)}</th>' + "".join(
        f'<th style="{CELL}" title="{col_axis} {j}">{esc(col_labels[j])}</th>' for j in range(n_cols))
    body = []
    for i in range(n_rows):
        cells = "".join(
            f'<td style="{CELL};background:{cell_colour(float(grid[i, j]), scale)}" '
            f'title="{esc(row_labels[i])} / {esc(col_labels[j])}: {float(grid[i, j]):.6g}">{float(grid[i, j]):.3g}</td>'
            for j in range(n_cols))
        body.append(f'<tr><th style="{CELL}">{esc(row_labels[i])}</th>{cells}</tr>')
    left = []
    if n_rows < grid.shape[0]:
        left.append(f"{grid.shape[0] - n_rows} of {grid.shape[0]} {row_axis} rows")
    if n_cols < grid.shape[1]:
        left.append(f"{grid.shape[1] - n_cols} of {grid.shape[1]} {col_axis} columns")
    note = f"<div>not shown: {esc(', '.join(left))}</div>" if left else ""
    legend = f"<div>colour: red &gt; 0 &gt; blue, full at |value| = {scale:.3g}</div>"
    return (f'<div><b>{esc(title)}</b><table style="{STYLE}"><tr>{head}</tr>{"".join(body)}</table>'
            f"{legend}{note}</div>")


# -- attribution graph --------------------------------------------------------------------------------

def graph_counts(graph) -> dict:
    scored = int((graph.edge_mask() & ~torch.isnan(graph.scores)).sum())
    counts = {"senders": len(graph.senders), "receivers": len(graph.receivers), "edges": graph.n_edges,
              "scored": scored}
    if graph.in_circuit is not None:
        counts["circuit edges"] = int(graph.in_circuit.sum())
        counts["circuit nodes"] = len(graph.nodes_in_circuit())
    return counts


def graph_repr(graph) -> str:
    counts = graph_counts(graph)
    text = (f"Graph({counts['senders']} senders, {counts['receivers']} receivers, {counts['edges']} edges "
            f"({counts['scored']} scored)")
    if graph.in_circuit is not None:
        text += f"; circuit: {counts['circuit edges']} edges over {counts['circuit nodes']} nodes"
    top = [(s, r, v) for s, r, v in graph.edges()[:3] if v == v]
    if top:
        text += "; top: " + ", ".join(f"{s}->{r} {v:+.3g}" for s, r, v in top)
    method = graph.metadata.get("method")
    return text + (f"; method {method}" if method else "") + ")"


def graph_html(graph) -> str:
    counts = graph_counts(graph)
    method = graph.metadata.get("method")
    parts = [table(counts.items(), title=f"Graph ({method})" if method else "Graph")]
    in_circuit = graph.in_circuit.cpu() if graph.in_circuit is not None else None
    index = {name: i for i, name in enumerate(graph.senders)}, {name: i for i, name in enumerate(graph.receivers)}
    rows = []
    for rank, (s, r, v) in enumerate(graph.edges()[:TOP_EDGES], 1):
        mark = "" if in_circuit is None else ("yes" if bool(in_circuit[index[0][s], index[1][r]]) else "no")
        rows.append((rank, s, r, f"{v:+.4g}", mark))
    header = ("#", "sender", "receiver", "score") + (() if in_circuit is None else ("in circuit",))
    if in_circuit is None:
        rows = [row[:4] for row in rows]
    parts.append(table(rows, header, f"top {len(rows)} edges by |score|"))
    if in_circuit is not None:
        nodes = graph.nodes_in_circuit()
        parts.append(table([(", ".join(nodes) or "(empty)",)], title=f"circuit nodes ({len(nodes)})"))
    return "".join(parts)


# -- SAE --------------------------------------------------------------------------------------------

EVAL_KEYS = ("l0", "explained_variance", "mse", "ce_loss_score", "kl_div_score", "dead_fraction", "n_tokens")


def sae_rows(sae) -> list:
    cfg = sae.cfg
    param = next(sae.parameters())
    rows = [("architecture", sae.architecture), ("hook", cfg.hook_name)]
    if cfg.is_transcoder:
        rows.append(("hook out", cfg.hook_name_out))
    rows += [("d_in", cfg.d_in), ("d_sae", cfg.d_sae), ("dtype", str(param.dtype).replace("torch.", "")),
             ("device", str(param.device))]
    evals = getattr(sae, "evals", None)
    if isinstance(evals, dict):
        rows += [(f"eval {k}", f"{evals[k]:.4g}" if isinstance(evals[k], float) else evals[k])
                 for k in EVAL_KEYS if k in evals]
    return rows


def saved_evals(folder) -> "dict | None":
    """The evals saved with the SAE in ``folder``: ``evals.json`` beside its ``cfg.json`` (a shipped SAE),
    or in the run folder above a ``sae/`` folder (as ``glassbox train-sae`` writes them); its ``evals``
    object of numbers. None where there is none, or it is not such an object: they are only shown."""
    import json
    from pathlib import Path

    folder = Path(folder)
    for path in (folder / "evals.json", *((folder.parent / "evals.json",) if folder.name == "sae" else ())):
        try:
            evals = json.loads(path.read_text(encoding="utf-8")).get("evals")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(evals, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           for v in evals.values()):
            return evals
    return None


def sae_repr(sae) -> str:
    cfg = sae.cfg
    out = f" -> {cfg.hook_name_out}" if cfg.is_transcoder else ""
    evals = getattr(sae, "evals", None)
    known = ""
    if isinstance(evals, dict) and "l0" in evals and "explained_variance" in evals:
        known = f", L0 {evals['l0']:.3g}, explained variance {evals['explained_variance']:.3g}"
    return f"{type(sae).__name__}({sae.architecture}, {cfg.hook_name}{out}, d_in={cfg.d_in}, d_sae={cfg.d_sae}{known})"


def sae_html(sae) -> str:
    return table(sae_rows(sae), title=type(sae).__name__)


# -- model ------------------------------------------------------------------------------------------

def model_family(cfg) -> str:
    """The Hugging Face family that can represent ``cfg``, or why none can."""
    from ..weights.architectures import architecture_of_config

    try:
        return architecture_of_config(cfg).model_type
    except ValueError:
        return "none (no Hugging Face architecture represents this config)"


def hooks_on(model) -> list:
    """(hook name, forward hooks, backward hooks) of each hook point with a hook attached."""
    return [(name, len(p.fwd_hooks), len(p.bwd_hooks)) for name, p in model.hook_dict.items() if p.has_hooks]


def model_html(model) -> str:
    cfg = model.cfg
    param = next(model.parameters())
    heads = f"{cfg.n_heads}" + (f" ({cfg.n_key_value_heads} key/value)" if cfg.n_key_value_heads
                                and cfg.n_key_value_heads != cfg.n_heads else "")
    rows = [("name", cfg.model_name), ("family", model_family(cfg)), ("layers", cfg.n_layers),
            ("d_model", cfg.d_model), ("heads", heads), ("d_head", cfg.d_head), ("d_mlp", cfg.d_mlp),
            ("d_vocab", cfg.d_vocab), ("n_ctx", cfg.n_ctx),
            ("parameters", f"{sum(p.numel() for p in model.parameters()):,}"),
            ("dtype", str(param.dtype).replace("torch.", "")), ("device", str(param.device)),
            ("hook points", len(model.hook_dict))]
    flags = [name for name in FLAG_NAMES if getattr(model.hook_flags, name, False) is True]
    rows.append(("hook flags on", ", ".join(flags) or "none"))
    attached = hooks_on(model)
    listed = ", ".join(f"{n} ({f} fwd, {b} bwd)" for n, f, b in attached[:10])
    more = f", and {len(attached) - 10} more" if len(attached) > 10 else ""
    rows.append(("hooks attached", f"{len(attached)} hook points: {listed}{more}" if attached else "none"))
    return table(rows, title=type(model).__name__)
