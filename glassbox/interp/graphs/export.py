"""Writing and reading attribution graphs.

- ``save_graph(graph, folder)`` / ``load_graph(folder)``: glassbox's own format, ``attribution_graph.safetensors``
  (tokens, active_features, activation_values, logit_tokens, logit_probabilities, adjacency, values) and
  ``attribution_graph.json`` ({"format": "glassbox-attribution-graph", "version": 1, "n_layers",
  "exclude_positions", "meta"}), written through ``fs.FolderWriter`` (a user's other files in the folder are
  kept). ``load_graph`` is strict: a missing file or key, a wrong dtype or shape, a non-finite value, a node
  count that does not add up, a feature outside its layer range or an edge that runs backwards is refused
  naming the file and key.
- ``frontend_json(graph, prune, ...)``: the JSON circuit-tracer's viewer reads (its
  ``utils/create_graph_files.py`` format: metadata, qParams, nodes, links), with the pruned nodes and edges.
  Node ids are circuit-tracer's ("{layer}_{feature}_{pos}", "E_{token}_{pos}", "{n_layers+1}_{token}_{pos}")
  except the error nodes': circuit-tracer writes "0_{layer}_{pos}", the id of feature {layer} of layer 0 at
  the same position, so here they are "err_{layer}_{pos}" (jsNodeId "err_{layer}_{pos}-0"); every id is unique
  (checked before writing). Links of weight exactly 0 (which circuit-tracer's pruning keeps at
  edge_threshold 1.0) are left out. ``save_graph(..., frontend=data)`` writes them as ``{slug}.json`` and
  ``graph-metadata.json`` (the list of graphs the viewer's index reads) beside glassbox's files; one graph per
  folder: saving another replaces it.
"""

import json
from pathlib import Path
from typing import Optional

import torch

from .graph import AttributionGraph

FORMAT, VERSION = "glassbox-attribution-graph", 1
TENSORS = "attribution_graph.safetensors"
META = "attribution_graph.json"
DTYPES = {"tokens": (torch.int64,), "active_features": (torch.int64,), "logit_tokens": (torch.int64,),
          "activation_values": (torch.float32, torch.float64), "logit_probabilities": (torch.float32, torch.float64),
          "adjacency": (torch.float32, torch.float64), "values": (torch.float32, torch.float64)}


def save_graph(graph: AttributionGraph, folder, *, frontend: Optional[dict] = None,
               pages: Optional[dict] = None) -> Path:
    """Write the graph (and, given, circuit-tracer's viewer files for ``frontend_json``'s data, and the
    pages {file name: html}) into ``folder`` in one crash-safe commit; glassbox's files of an earlier graph
    there that this one lacks are removed, a user's other files kept."""
    from ...fs.folder import FolderWriter

    tensors = {name: getattr(graph, name).contiguous() for name in DTYPES}
    meta = {"format": FORMAT, "version": VERSION, "n_layers": graph.n_layers,
            "exclude_positions": graph.exclude_positions, "meta": _jsonable(graph.meta)}
    texts = {META: json.dumps(meta, indent=1)}
    if frontend is not None:
        slug = frontend["metadata"]["slug"]
        if not isinstance(slug, str) or not slug or "/" in slug or slug.startswith(".") or slug in (META, "graph-metadata"):
            raise ValueError(f"slug must be a plain file name, got {slug!r}")
        texts[f"{slug}.json"] = json.dumps(frontend, indent=1, allow_nan=False)
        texts["graph-metadata.json"] = json.dumps({"graphs": [frontend["metadata"]]}, indent=2)
    texts.update(pages or {})
    with FolderWriter(folder, owner="attribution-graph", adopt=(TENSORS, *texts)) as w:
        w.save_safetensors(TENSORS, tensors)
        for name, text in texts.items():
            w.write_text(name, text)
    return Path(folder)


def _jsonable(meta: dict) -> dict:
    return json.loads(json.dumps(meta, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def load_graph(folder) -> AttributionGraph:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ...fs.folder import recover

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no attribution graph folder at {folder}")
    recover(folder)
    meta_path, tensor_path = folder / META, folder / TENSORS
    for p in (meta_path, tensor_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: {folder} is not a saved attribution graph")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path} is not valid JSON: {e}") from None

    def bad(key, what):
        raise ValueError(f"{meta_path}: {key!r} {what}")

    if not isinstance(meta, dict):
        bad("(top level)", "must be a JSON object")
    if meta.get("format") != FORMAT:
        bad("format", f"must be {FORMAT!r}, got {meta.get('format')!r}")
    if meta.get("version") != VERSION or isinstance(meta.get("version"), bool):
        bad("version", f"must be {VERSION}, got {meta.get('version')!r}")
    for key in ("n_layers", "exclude_positions"):
        v = meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "n_layers" else 0):
            bad(key, f"must be a {'positive' if key == 'n_layers' else 'non-negative'} int, got {v!r}")
    if not isinstance(meta.get("meta", {}), dict):
        bad("meta", "must be an object")
    try:
        t = load_file(str(tensor_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"{tensor_path} is not a readable safetensors file: {e}") from None

    def tbad(key, what):
        raise ValueError(f"{tensor_path}: tensor {key!r} {what}")

    for key, dtypes in DTYPES.items():
        if key not in t:
            tbad(key, "is missing")
        if t[key].dtype not in dtypes:
            tbad(key, f"has dtype {t[key].dtype}, expected {' or '.join(map(str, dtypes))}")
        if t[key].is_floating_point() and not torch.isfinite(t[key]).all():
            tbad(key, "holds a NaN or inf")
    extra = sorted(set(t) - set(DTYPES))
    if extra:
        tbad(extra[0], "is not part of the format")
    L, excl = meta["n_layers"], meta["exclude_positions"]
    tokens, feats = t["tokens"], t["active_features"]
    if tokens.ndim != 1 or len(tokens) == 0:
        tbad("tokens", f"must be [pos] with pos >= 1, got shape {tuple(tokens.shape)}")
    P = len(tokens)
    if feats.ndim != 2 or feats.shape[1] != 3:
        tbad("active_features", f"must be [n_features 3], got shape {tuple(feats.shape)}")
    n_f, K = feats.shape[0], t["logit_tokens"].shape[0] if t["logit_tokens"].ndim == 1 else -1
    if K < 1:
        tbad("logit_tokens", f"must be [n_logits] with n_logits >= 1, got shape {tuple(t['logit_tokens'].shape)}")
    for key, shape in (("activation_values", (n_f,)), ("logit_probabilities", (K,))):
        if tuple(t[key].shape) != shape:
            tbad(key, f"has shape {tuple(t[key].shape)}, expected {shape}")
    N = n_f + (L + 1) * P + K
    if tuple(t["adjacency"].shape) != (N, N):
        tbad("adjacency", f"has shape {tuple(t['adjacency'].shape)}; {n_f} features, {L}x{P} errors, {P} tokens and "
                          f"{K} logits make {N} nodes")
    if tuple(t["values"].shape) != (N,):
        tbad("values", f"has shape {tuple(t['values'].shape)}, expected ({N},)")
    if n_f:
        if not ((feats[:, 0] >= 0) & (feats[:, 0] < L) & (feats[:, 1] >= excl) & (feats[:, 1] < P)
                & (feats[:, 2] >= 0)).all():
            tbad("active_features", f"has a row outside layers [0, {L}) or positions [{excl}, {P})")
        keys = (feats[:, 0] * P + feats[:, 1]) * (int(feats[:, 2].max()) + 1) + feats[:, 2]
        if not (keys[1:] > keys[:-1]).all():
            tbad("active_features", "must be sorted by layer, position, feature, without repeats")
    graph = AttributionGraph(tokens=tokens, active_features=feats, activation_values=t["activation_values"],
                             logit_tokens=t["logit_tokens"], logit_probabilities=t["logit_probabilities"],
                             adjacency=t["adjacency"], values=t["values"], n_layers=L, exclude_positions=excl,
                             meta=meta.get("meta", {}))
    layers, positions = graph.node_layers_positions()
    A = graph.adjacency
    src_kind_token = torch.zeros(N, dtype=torch.bool)
    src_kind_token[graph.token_start:graph.logit_start] = True
    backwards = ((layers[None, :n_f + L * P] >= layers[:n_f, None]) |
                 (positions[None, :n_f + L * P] > positions[:n_f, None])) & (A[:n_f, :n_f + L * P] != 0)
    if backwards.any() or (A[:n_f, graph.token_start:graph.logit_start] != 0)[
            positions[None, graph.token_start:graph.logit_start] > positions[:n_f, None]].any():
        tbad("adjacency", "has an edge into a feature from a later layer or position")
    if (A[graph.error_start:graph.logit_start] != 0).any() or (A[:, graph.logit_start:] != 0).any():
        tbad("adjacency", "has an edge into an error or token node, or out of a logit node")
    return graph


def node_records(graph: AttributionGraph, mask, cumulative, token_strings, logit_strings) -> dict:
    """{node index: circuit-tracer's node record} for the nodes in ``mask``."""
    L = graph.n_layers
    out = {}
    for i in mask.nonzero()[:, 0].tolist():
        kind = graph.node_kind(i)
        inf = float(cumulative[i])
        if kind == "feature":
            layer, pos, f = graph.active_features[i].tolist()
            rec = dict(node_id=f"{layer}_{f}_{pos}", feature=(layer + f) * (layer + f + 1) // 2 + f, layer=str(layer),
                       ctx_idx=pos, feature_type="cross layer transcoder", jsNodeId=f"{layer}_{f}-0", influence=inf,
                       activation=float(graph.activation_values[i]))
        elif kind == "error":
            layer, pos = graph.node_layer_pos(i)
            rec = dict(node_id=f"err_{layer}_{pos}", feature=-1, layer=str(layer), ctx_idx=pos,
                       feature_type="mlp reconstruction error", jsNodeId=f"err_{layer}_{pos}-0", influence=inf)
        elif kind == "token":
            pos = i - graph.token_start
            tok = int(graph.tokens[pos])
            rec = dict(node_id=f"E_{tok}_{pos}", feature=pos, layer="E", ctx_idx=pos, feature_type="embedding",
                       jsNodeId=f"E_{tok}-{pos}", influence=inf)
        else:
            k = i - graph.logit_start
            tok, p = int(graph.logit_tokens[k]), float(graph.logit_probabilities[k])
            rec = dict(node_id=f"{L + 1}_{tok}_{graph.n_pos - 1}", feature=tok, layer=str(L + 1), ctx_idx=graph.n_pos - 1,
                       feature_type="logit", token_prob=p, is_target_logit=k == 0, jsNodeId=f"L_{tok}-{graph.n_pos - 1}",
                       clerp=f'Output "{logit_strings[k]}" (p={p:.3f})')
        base = dict(token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, clerp="", influence=None,
                    activation=None)
        out[i] = {**base, **rec}
    return out


def frontend_json(graph: AttributionGraph, prune, *, slug: str, prompt: str, token_strings, logit_strings,
                  scan: str = "glassbox", node_threshold: float = 0.8) -> dict:
    """circuit-tracer's viewer JSON of the pruned graph (module docstring)."""
    if len(token_strings) != graph.n_pos or len(logit_strings) != graph.n_logits:
        raise ValueError(f"token_strings needs {graph.n_pos} entries and logit_strings {graph.n_logits}, got "
                         f"{len(token_strings)} and {len(logit_strings)}")
    nodes = node_records(graph, prune.node_mask, prune.cumulative_scores, token_strings, logit_strings)
    ids = [n["node_id"] for n in nodes.values()]
    if len(set(ids)) != len(ids):
        raise AssertionError("node ids collide")  # cannot happen: the id forms are disjoint (tested)
    dst, src = prune.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency[dst, src].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[d]["node_id"], "weight": w}
             for s, d, w in zip(src.tolist(), dst.tolist(), weights) if s in nodes and d in nodes and w != 0]
    connected = {x for link in links for x in (link["source"], link["target"])}
    used = [n for n in nodes.values() if n["node_id"] in connected or n["feature_type"] in ("embedding", "logit")]
    meta = dict(slug=slug, scan=scan, transcoder_list=[], prompt_tokens=list(token_strings), prompt=prompt,
                node_threshold=node_threshold, schema_version=1)
    return {"metadata": meta, "qParams": dict(pinnedIds=[], supernodes=[], linkType="both", clickedId="", sg_pos=""),
            "nodes": used, "links": links}
