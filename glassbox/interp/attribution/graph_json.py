"""The graph file format (``Graph.to_json`` / ``from_json`` / ``load_json``), read strictly.

A file is one JSON object with exactly these keys (format 1, the only one glassbox has written):

    format       "glassbox.graph"
    version      1 (the JSON integer; 1.0, "1" and true are refused)
    senders      the complete sender list of one model shape, in ``edges.senders`` order
    receivers    the complete receiver list of the same shape, in ``edges.receivers`` order
    nodes        ``edges.nodes(senders, receivers)``, exactly
    edges        every edge of those lists exactly once (any order), each an object with exactly
                 "sender", "receiver", "score" (a finite JSON number within float32's range, or null
                 for an unscored edge) and, when has_circuit is true, "in_circuit" (true or false);
                 with has_circuit false an edge has no "in_circuit"
    has_circuit  true or false
    metadata     an object; when it holds "cfg" (as ``eap`` writes it), its n_layers, n_heads,
                 attn_only and (for grouped key/value receivers) n_key_value_heads must be the
                 shape the names give

Anything else is refused with a ValueError that names the file (or "graph JSON" for a dict) and the
first bad entry ("edges[12] ('a0.h1' -> 'm1'): ..."): a missing or repeated edge, a key missing,
unknown or given twice in one object, a wrong type, NaN / Infinity literals or a number that
overflows (1e400), a score that overflows float32, text that is not UTF-8 or not JSON, an empty
file. A UTF-8 byte-order mark is skipped. ``load_json(path, model=...)`` also refuses a graph whose
names are not that model's (naming n_layers, n_heads, n_key_value_heads or attn_only).

Scores are read as float32: a number with more digits than float32 holds (a hand edit such as
0.1) is rounded to the nearest float32; every number glassbox writes is a float32 value, read back
exactly. Files written before this strict reader (format 1, same keys) read unchanged: every graph
file glassbox has written carries "version": 1 (since the first Graph), so a file without a version
is not one of them and is refused like any missing key.
"""

import json
import math
from pathlib import Path

import torch

from .edges import describe_shape, edge_exists, model_shape, nodes, shape_of_config

JSON_FORMAT = "glassbox.graph"
JSON_VERSION = 1
TOP_KEYS = ("format", "version", "senders", "receivers", "nodes", "edges", "has_circuit", "metadata")
EDGE_KEYS = ("sender", "receiver", "score")
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _kind(value) -> str:
    """The JSON kind of a parsed value, as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, _NonFinite):
        return f"the non-finite literal {value.text}"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(
        type(value), type(value).__name__)


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice in one object")
        out[key] = value
    return out


class _NonFinite:
    """What a NaN / Infinity literal or an overflowing number (1e400) parses to, so the check can name
    the entry holding it."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _finite_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _non_finite_in(value, where: str):
    """The path and literal of the first non-finite number inside ``value``, or None."""
    if isinstance(value, _NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
        return where, repr(value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_in(item, f"{where}.{key}" if isinstance(value, dict) else f"{where}[{key}]")
        if found:
            return found
    return None


def parse(text: str, source: str):
    """JSON text -> Python values, refusing duplicate keys and non-finite numbers."""
    if not text.strip():
        raise ValueError(f"{source}: the file is empty (no graph in it)")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_finite_float,
                          parse_constant=_NonFinite)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno}; "
                         "the file may be truncated or hand-edited)") from None
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def read_text(path) -> str:
    """The file's text (UTF-8, an optional byte-order mark skipped); errors name the path."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give the graph's JSON file (e.g. {path / 'graph.json'})")
    data = path.read_bytes()  # FileNotFoundError names the path
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start} is {data[error.start]:#04x}); a graph file "
                         "is JSON written as UTF-8") from None


def load(path, model=None) -> dict:
    """The checked parts of the graph file at ``path`` (see ``check``)."""
    return check(parse(read_text(path), str(path)), str(path), model)


def _fail(source: str, message: str):
    raise ValueError(f"{source}: {message}")


def _keys(source: str, where: str, obj: dict, required: tuple, optional: tuple = (), why: str = "") -> None:
    missing = [k for k in required if k not in obj]
    if missing:
        _fail(source, f"{where} has no {missing[0]!r} (it needs {', '.join(map(repr, required))}{why})")
    unknown = [k for k in obj if k not in required and k not in optional]
    if unknown:
        _fail(source, f"{where} has the unknown key {unknown[0]!r} (a graph file holds only "
              f"{', '.join(map(repr, required + optional))})")


def _names(source: str, data: dict, key: str) -> list:
    names = data[key]
    if not isinstance(names, list):
        _fail(source, f"{key} must be a list of names, got a {_kind(names)}")
    for i, name in enumerate(names):
        if not isinstance(name, str):
            _fail(source, f"{key}[{i}] must be a name (str), got {name!r} ({_kind(name)})")
    return names


def check(data, source: str = "graph JSON", model=None) -> dict:
    """Validate parsed JSON (module docstring) -> {"senders", "receivers", "scores" (list of rows,
    NaN for null), "circuit" (list of rows of bool, or None), "metadata"}."""
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
        got = (f"a {_kind(data)}" if not isinstance(data, dict) else f"format {data['format']!r}" if "format" in data
               else "an object without the key 'format'")
        _fail(source, f"not a glassbox graph: expected an object with format {JSON_FORMAT!r}, got {got}")
    _keys(source, "the file", data, TOP_KEYS)
    version = data["version"]
    if type(version) is not int or version != JSON_VERSION:
        _fail(source, f"version {version!r} ({_kind(version)}) is not supported: this glassbox reads version "
              f"{JSON_VERSION} (the integer)")
    senders, receivers = _names(source, data, "senders"), _names(source, data, "receivers")
    try:
        shape = model_shape(senders, receivers)
    except ValueError as error:
        _fail(source, str(error))
    _check_nodes(source, data["nodes"], nodes(senders, receivers))
    metadata = data["metadata"]
    if not isinstance(metadata, dict):
        _fail(source, f"metadata must be an object, got a {_kind(metadata)}")
    found = _non_finite_in(metadata, "metadata")
    if found:
        _fail(source, f"{found[0]} is {found[1]}, which is not a finite number (JSON holds none)")
    _check_metadata_shape(source, metadata, shape)
    if model is not None:
        _check_model(source, shape, getattr(model, "cfg", model))
    has_circuit = data["has_circuit"]
    if not isinstance(has_circuit, bool):
        _fail(source, f"has_circuit must be true or false, got {has_circuit!r} ({_kind(has_circuit)})")
    scores, circuit = _edges(source, data["edges"], senders, receivers, has_circuit)
    return {"senders": senders, "receivers": receivers, "scores": scores, "circuit": circuit, "metadata": metadata}


def check_writable(senders: list, receivers: list, metadata: dict) -> None:
    """Refuse, before anything is written, a graph the reader would refuse: names that are not one model's
    complete lists, a metadata.cfg that disagrees with them, a non-finite number in the metadata."""
    source = "Graph.to_json"
    try:
        shape = model_shape(senders, receivers)
    except ValueError as error:
        _fail(source, str(error))
    found = _non_finite_in(metadata, "metadata")
    if found:
        _fail(source, f"{found[0]} is {found[1]}, which is not a finite number (JSON holds none)")
    _check_metadata_shape(source, metadata, shape)


def _check_nodes(source: str, given, expected: list) -> None:
    if given == expected:
        return
    if not isinstance(given, list):
        _fail(source, f"nodes must be a list, got a {_kind(given)}")
    i = next((i for i, (a, b) in enumerate(zip(given, expected)) if a != b), min(len(given), len(expected)))
    got = repr(given[i]) if i < len(given) else "the end of the list"
    want = repr(expected[i]) if i < len(expected) else "the end of the list"
    _fail(source, f"nodes[{i}] is {got} where the senders and receivers give {want} (nodes must be "
          "edges.nodes(senders, receivers))")


def _check_metadata_shape(source: str, metadata: dict, shape: dict) -> None:
    cfg = metadata.get("cfg")
    if cfg is None:
        return
    if not isinstance(cfg, dict):
        _fail(source, f"metadata.cfg must be an object, got a {_kind(cfg)}")
    for field in ("n_layers", "n_heads", "attn_only") + (("n_key_value_heads",) if shape["n_key_value_heads"] else ()):
        if field in cfg and (cfg[field] != shape[field] or type(cfg[field]) is not type(shape[field])):
            _fail(source, f"metadata.cfg.{field} is {cfg[field]!r}, but the senders and receivers are those of a "
                  f"model of {describe_shape(shape)} ({field}={shape[field]!r})")


def _check_model(source: str, shape: dict, cfg) -> None:
    want = shape_of_config(cfg)
    for field in ("n_layers", "n_heads", "n_key_value_heads", "attn_only"):
        if shape[field] != want[field]:
            _fail(source, f"the graph is for a model of {describe_shape(shape)}, this model has "
                  f"{describe_shape(want)} ({field} {shape[field]!r} in the file, {want[field]!r} here)")


def _edges(source: str, edges, senders: list, receivers: list, has_circuit: bool) -> tuple:
    if not isinstance(edges, list):
        _fail(source, f"edges must be a list, got a {_kind(edges)}")
    s_index = {n: i for i, n in enumerate(senders)}
    r_index = {n: i for i, n in enumerate(receivers)}
    scores = [[math.nan] * len(receivers) for _ in senders]
    circuit = [[False] * len(receivers) for _ in senders] if has_circuit else None
    seen = {}
    for i, edge in enumerate(edges):
        where = f"edges[{i}]"
        if not isinstance(edge, dict):
            _fail(source, f"{where} must be an object with 'sender', 'receiver' and 'score', got a {_kind(edge)}")
        if not has_circuit and "in_circuit" in edge:
            _fail(source, f"{where} has 'in_circuit', but has_circuit is false (an edge of a graph without a circuit "
                  "has no in_circuit)")
        _keys(source, where, edge, EDGE_KEYS + (("in_circuit",) if has_circuit else ()),
              why=", since has_circuit is true" if has_circuit else "")
        sender, receiver = edge["sender"], edge["receiver"]
        for key, name in (("sender", sender), ("receiver", receiver)):
            if not isinstance(name, str):
                _fail(source, f"{where}: {key} must be a name (str), got {name!r} ({_kind(name)})")
        if sender not in s_index or receiver not in r_index:
            name = sender if sender not in s_index else receiver
            kind = "sender" if sender not in s_index else "receiver"
            _fail(source, f"{where} names the {kind} {name!r}, which is not in the file's {kind}s")
        where = f"{where} ({sender!r} -> {receiver!r})"
        if not edge_exists(sender, receiver):
            _fail(source, f"{where} is not an edge (the sender is not upstream of the receiver)")
        if (sender, receiver) in seen:
            _fail(source, f"{where} is listed twice (first as edges[{seen[sender, receiver]}])")
        seen[sender, receiver] = i
        s, r = s_index[sender], r_index[receiver]
        scores[s][r] = _score(source, where, edge["score"])
        if has_circuit:
            flag = edge["in_circuit"]
            if not isinstance(flag, bool):
                _fail(source, f"{where}: in_circuit must be true or false, got {flag!r} ({_kind(flag)})")
            circuit[s][r] = flag
    expected = [(s, r) for s in senders for r in receivers if edge_exists(s, r)]
    if len(seen) != len(expected):
        first = next(pair for pair in expected if pair not in seen)
        _fail(source, f"edges lists {len(seen)} of the {len(expected)} edges of these senders and receivers: "
              f"{first[0]!r} -> {first[1]!r} is missing (an unscored edge is listed with score null)")
    return scores, circuit


def _score(source: str, where: str, value) -> float:
    if value is None:
        return math.nan
    if isinstance(value, _NonFinite):
        _fail(source, f"{where}: score {value.text} is not a finite number (an unscored edge has score null)")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(source, f"{where}: score must be a number or null, got {value!r} ({_kind(value)})")
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float) and isinstance(value, float):
        _fail(source, f"{where}: score {value} is not a finite number (an unscored edge has score null)")
    if not abs(as_float) <= _FLOAT32_MAX:
        text = str(value) if len(str(value)) <= 24 else str(value)[:12] + f"... ({len(str(value))} digits)"
        _fail(source, f"{where}: score {text} is beyond float32's range (|score| <= {_FLOAT32_MAX:.6g}), "
              "so it cannot be stored")
    return as_float
