"""The nodes of the edge graph, by name, and which sender feeds which receiver.

Senders (what writes into the residual stream), in forward order:
  ``"input"``      the embeddings entering layer 0 (``blocks.0.hook_resid_pre``);
  ``"a{L}.h{H}"``  head H of layer L (``blocks.L.attn.hook_result[:, :, H]``; excludes b_O);
  ``"m{L}"``       layer L's MLP (``blocks.L.hook_mlp_out``; absent in attention-only models).
Receivers (what reads the residual stream), in forward order; within layer L first every head's
query input, then the key inputs, then the value inputs (the order of the hook tensors' head axis),
then the MLP:
  ``"a{L}.h{H}.q"``                 ``blocks.L.hook_q_input[:, :, H]``;
  ``"a{L}.h{H}.k"``, ``".v"``       ``blocks.L.hook_k_input[:, :, H]`` / ``hook_v_input`` when every head
                                    has its own key/value input;
  ``"a{L}.kv{G}.k"``, ``".v"``      under grouped-query attention (n_key_value_heads < n_heads, not
                                    ungrouped) one per kv head G, which query heads
                                    G*n_heads/n_kv .. (G+1)*n_heads/n_kv - 1 share;
  ``"m{L}"``                        ``blocks.L.hook_mlp_in``;
  ``"logits"``                      ``blocks.{n_layers-1}.hook_resid_post`` (before ln_final).

An edge s -> r exists when s is strictly upstream of r: the input sends to every receiver, a head
of layer L to every receiver of later layers, to m{L} and to the logits, m{L} to every receiver of
later layers and to the logits. ``edge_exists`` decides this from the two names alone, so every
module (scoring, exact evaluation, plots, JSON) agrees without a model.
"""

import re

import torch
from torch import Tensor

_SENDER = re.compile(r"^(?:input|a(\d+)\.h(\d+)|m(\d+))$")
_RECEIVER = re.compile(r"^(?:logits|a(\d+)\.h(\d+)\.([qkv])|a(\d+)\.kv(\d+)\.([kv])|m(\d+))$")

# Forward position of a node: (layer, 0) for attention, (layer, 1) for the MLP; a sender feeds a
# receiver when its position is strictly earlier. The input sits before everything, the logits after.
_BEFORE_ALL = (-1, 0)
_AFTER_ALL = (float("inf"), 0)


def sender_position(name: str) -> tuple:
    """(layer, 0 for a head / 1 for an MLP) of a sender; (-1, 0) for "input". ValueError on a bad name."""
    match = _SENDER.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"{name!r} is not a sender name: expected 'input', 'a{{L}}.h{{H}}' or 'm{{L}}'")
    if name == "input":
        return _BEFORE_ALL
    if match.group(1) is not None:
        return (int(match.group(1)), 0)
    return (int(match.group(3)), 1)


def receiver_position(name: str) -> tuple:
    """(layer, 0 for a q/k/v input / 1 for an MLP input) of a receiver; (inf, 0) for "logits"."""
    match = _RECEIVER.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"{name!r} is not a receiver name: expected 'a{{L}}.h{{H}}.q|k|v', 'a{{L}}.kv{{G}}.k|v', "
                         "'m{L}' or 'logits'")
    if name == "logits":
        return _AFTER_ALL
    if match.group(1) is not None:
        return (int(match.group(1)), 0)
    if match.group(4) is not None:
        return (int(match.group(4)), 0)
    return (int(match.group(7)), 1)


def edge_exists(sender: str, receiver: str) -> bool:
    """Whether ``sender`` writes into the residual stream upstream of what ``receiver`` reads."""
    return sender_position(sender) < receiver_position(receiver)


def edge_mask_for(sender_names: list, receiver_names: list, device=None) -> Tensor:
    """bool [n_senders, n_receivers]: ``edge_exists`` for every pair (vectorised over the positions)."""
    def key(pos: tuple) -> float:
        return pos[0] * 2 + pos[1]
    s = torch.tensor([key(sender_position(n)) for n in sender_names], dtype=torch.float64, device=device)
    r = torch.tensor([key(receiver_position(n)) for n in receiver_names], dtype=torch.float64, device=device)
    return s[:, None] < r[None, :]


def _n_kv_inputs(cfg) -> int:
    """How many key (and value) inputs a layer has: n_heads, or n_key_value_heads under grouped-query."""
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    if getattr(cfg, "ungroup_grouped_query_attention", False):
        return cfg.n_heads
    return n_kv


def kv_is_grouped(cfg) -> bool:
    """Whether the key/value receivers are per kv head ("a{L}.kv{G}.k") rather than per query head."""
    return _n_kv_inputs(cfg) != cfg.n_heads


def _has_mlp(cfg) -> bool:
    return not getattr(cfg, "attn_only", False)


def senders(cfg) -> list:
    """Every sender name of a model with this config, in forward order."""
    names = ["input"]
    for layer in range(cfg.n_layers):
        names += [f"a{layer}.h{head}" for head in range(cfg.n_heads)]
        if _has_mlp(cfg):
            names.append(f"m{layer}")
    return names


def receivers(cfg) -> list:
    """Every receiver name of a model with this config, in forward order (see the module docstring)."""
    n_kv, grouped = _n_kv_inputs(cfg), kv_is_grouped(cfg)
    names = []
    for layer in range(cfg.n_layers):
        names += [f"a{layer}.h{head}.q" for head in range(cfg.n_heads)]
        for part in ("k", "v"):
            if grouped:
                names += [f"a{layer}.kv{group}.{part}" for group in range(n_kv)]
            else:
                names += [f"a{layer}.h{head}.{part}" for head in range(cfg.n_heads)]
        if _has_mlp(cfg):
            names.append(f"m{layer}")
    names.append("logits")
    return names


def sender_hook(name: str, cfg) -> tuple:
    """(hook name, head index or None) holding a sender's output in a forward with use_attn_result on."""
    sender_position(name)
    if name == "input":
        return "blocks.0.hook_resid_pre", None
    match = _SENDER.match(name)
    if match.group(1) is not None:
        layer, head = int(match.group(1)), int(match.group(2))
        _check_index(name, layer, cfg.n_layers, "layer")
        _check_index(name, head, cfg.n_heads, "head")
        return f"blocks.{layer}.attn.hook_result", head
    layer = int(match.group(3))
    _check_index(name, layer, cfg.n_layers, "layer")
    if not _has_mlp(cfg):
        raise ValueError(f"sender {name!r}: the model is attention-only (Config.attn_only=True), it has no MLPs")
    return f"blocks.{layer}.hook_mlp_out", None


def receiver_hook(name: str, cfg) -> tuple:
    """(hook name, head / kv-head index or None) of a receiver's input, under use_split_qkv_input and
    use_hook_mlp_in; "logits" is ``blocks.{n_layers-1}.hook_resid_post``."""
    receiver_position(name)
    if name == "logits":
        return f"blocks.{cfg.n_layers - 1}.hook_resid_post", None
    match = _RECEIVER.match(name)
    if match.group(1) is not None:
        layer, head, part = int(match.group(1)), int(match.group(2)), match.group(3)
        _check_index(name, layer, cfg.n_layers, "layer")
        _check_index(name, head, cfg.n_heads, "head")
        if part != "q" and kv_is_grouped(cfg):
            raise ValueError(f"receiver {name!r}: this model has grouped key/value heads; name them "
                             f"'a{layer}.kv{{G}}.{part}' with G < {_n_kv_inputs(cfg)}")
        return f"blocks.{layer}.hook_{part}_input", head
    if match.group(4) is not None:
        layer, group, part = int(match.group(4)), int(match.group(5)), match.group(6)
        _check_index(name, layer, cfg.n_layers, "layer")
        if not kv_is_grouped(cfg):
            raise ValueError(f"receiver {name!r}: this model has one key/value input per head; name it "
                             f"'a{layer}.h{{H}}.{part}'")
        _check_index(name, group, _n_kv_inputs(cfg), "kv head")
        return f"blocks.{layer}.hook_{part}_input", group
    layer = int(match.group(7))
    _check_index(name, layer, cfg.n_layers, "layer")
    if not _has_mlp(cfg):
        raise ValueError(f"receiver {name!r}: the model is attention-only (Config.attn_only=True), it has no MLPs")
    return f"blocks.{layer}.hook_mlp_in", None


def receiver_node(name: str) -> str:
    """The node a receiver belongs to: "a1.h0.q" -> "a1.h0", "a1.kv0.k" -> "a1.kv0", "m1", "logits"."""
    receiver_position(name)
    return name.rsplit(".", 1)[0] if name.startswith("a") else name


def _check_index(name: str, value: int, limit: int, what: str) -> None:
    if value >= limit:
        raise ValueError(f"{name!r}: {what} {value} is out of range (the model has {limit})")


def nodes(sender_names: list, receiver_names: list) -> list:
    """Every node of a graph, each once: the senders, then the receivers' nodes not among them (kv
    heads "a{L}.kv{G}", "logits"), in the order given."""
    out, seen = [], set()
    for name in list(sender_names) + [receiver_node(r) for r in receiver_names]:
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def model_shape(sender_names: list, receiver_names: list) -> dict:
    """The model shape whose complete sender and receiver lists these are, in ``senders``/``receivers``
    order: {"n_layers", "n_heads", "n_key_value_heads" (None where every head has its own key/value
    input), "attn_only"}. ValueError naming the first name that does not fit any model."""
    check_names(sender_names, receiver_names)
    layers = [sender_position(n)[0] for n in sender_names if n != "input"]
    n_layers = max(layers) + 1 if layers else 0
    if n_layers == 0:
        raise ValueError(f"senders {list(sender_names)!r} name no layer: a model has at least one")
    n_heads = sum(1 for n in sender_names if n.startswith("a0.h"))
    groups = {n for n in receiver_names if n.startswith("a0.kv")}
    n_kv = len(groups) // 2 if groups else None
    attn_only = not any(n.startswith("m") for n in sender_names)
    shape = {"n_layers": n_layers, "n_heads": n_heads, "n_key_value_heads": n_kv, "attn_only": attn_only}
    cfg = _Shape(n_layers, n_heads, n_kv or n_heads, attn_only)
    for kind, given, expected in (("senders", sender_names, senders(cfg)), ("receivers", receiver_names,
                                                                           receivers(cfg))):
        if list(given) != expected:
            i = next((i for i, (a, b) in enumerate(zip(given, expected)) if a != b), min(len(given), len(expected)))
            got = repr(given[i]) if i < len(given) else "the end of the list"
            want = repr(expected[i]) if i < len(expected) else "the end of the list"
            raise ValueError(f"{kind} are not those of any model: {kind}[{i}] is {got} where a model of "
                             f"{describe_shape(shape)} has {want} ({len(given)} names given, {len(expected)} expected)")
    return shape


def shape_of_config(cfg) -> dict:
    """``model_shape``'s dict for a model config (n_key_value_heads None unless keys/values are grouped)."""
    return {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "n_key_value_heads": _n_kv_inputs(cfg) if kv_is_grouped(cfg) else None, "attn_only": not _has_mlp(cfg)}


def describe_shape(shape: dict) -> str:
    kv = f" over {shape['n_key_value_heads']} kv heads" if shape["n_key_value_heads"] else ""
    return (f"n_layers={shape['n_layers']} x n_heads={shape['n_heads']}{kv}, "
            + ("attention-only (attn_only=True)" if shape["attn_only"] else "with MLPs (attn_only=False)"))


class _Shape:
    """The config fields ``senders`` and ``receivers`` read."""

    def __init__(self, n_layers: int, n_heads: int, n_key_value_heads: int, attn_only: bool):
        self.n_layers, self.n_heads, self.n_key_value_heads, self.attn_only = n_layers, n_heads, n_key_value_heads, \
            attn_only


def check_names(sender_names: list, receiver_names: list) -> None:
    """Raise ValueError for a malformed or repeated name."""
    for kind, names, parse in (("sender", sender_names, sender_position), ("receiver", receiver_names,
                                                                             receiver_position)):
        seen = set()
        for name in names:
            parse(name)
            if name in seen:
                raise ValueError(f"{kind} {name!r} appears twice")
            seen.add(name)
