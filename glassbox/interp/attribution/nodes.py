"""Nodes for attribution patching: which hook points an ``activation`` names, their axes, and how a
per-element score [batch *act_axes] sums to one score per node [batch *result_axes].

``activation`` is read as the patching engine reads it (``glassbox.interp.patching.ACTIVATIONS``:
"resid_pre", "z", "q", "k", "v", "mlp_out", "mlp_post", "pattern", ...; or a template with ``{L}``),
plus the flag-gated per-head points ("result", "q_input", "k_input", "v_input", "mlp_in", turned on
for the run by the caller) and any full hook name (no ``{L}``, e.g. an SAE's
``blocks.0.hook_resid_pre.hook_sae_acts_post``): one hook point, no layer axis.

Axes: a template's ``axes`` start with "layer", then any axes of its hook (``HOOK_SHAPES``), in the
result's order; axes not named are summed over (the node is the whole slice, as a sweep patches
axes it does not index whole). The MLP's hidden axis is called "neuron" (HOOK_SHAPES's d_mlp). A
hook HOOK_SHAPES does not know needs its axes named: ``hook_axes`` (after batch), which default to
``axes`` (every axis a result axis).

Under grouped-query attention keys and values have a ``kv_head`` axis; asking for "head" there is
refused with the sweeps' message (the named functions ask for "kv_head" themselves).
"""

from dataclasses import dataclass
from typing import Optional, Sequence

from torch import Tensor

from ...hooks import unknown_name_message
from ...models.hook_flags import gating_flag
from ...models.hook_shapes import FLAG_GATED_HOOKS, axis_sizes, hook_pattern, hook_shape
from ..patching.engine import ACTIVATIONS, position_labels

ATP_ACTIVATIONS = {
    **ACTIVATIONS, "result": "blocks.{L}.attn.hook_result", "q_input": "blocks.{L}.hook_q_input",
    "k_input": "blocks.{L}.hook_k_input", "v_input": "blocks.{L}.hook_v_input", "mlp_in": "blocks.{L}.hook_mlp_in",
}
AXIS_NAMES = {"d_mlp": "neuron"}  # HOOK_SHAPES axis -> the name results use
NOT_NODE_AXES = ("batch",)


@dataclass
class NodeSpec:
    """One activation's nodes: the hook names (one per layer, or one), the hook's axes after batch,
    and the result's axes (with "layer" first for a template)."""

    activation: str
    names: list
    layered: bool
    act_axes: tuple
    axes: tuple
    flag: Optional[str] = None  # the HookFlags field the hook needs, or None
    known_shape: bool = True  # whether act_axes come from HOOK_SHAPES

    @property
    def node_axes(self) -> tuple:
        """The result's axes within one hook (without "layer")."""
        return self.axes[1:] if self.layered else self.axes

    @property
    def template(self) -> str:
        return self.names[0] if not self.layered else self.names[0].replace(".0.", ".{L}.", 1)

    def is_attention(self, point: str) -> bool:
        """Whether this is ``blocks.{L}.attn.hook_<point>`` (e.g. "q", "k")."""
        return self.layered and self.template == f"blocks.{{L}}.attn.hook_{point}"


def resolve_nodes(model, activation: str, axes: Sequence[str], hook_axes: Optional[Sequence[str]] = None) -> NodeSpec:
    """The NodeSpec of ``activation`` with result ``axes``; clear errors for unknown names and axes
    that do not fit. Flag-gated hooks are accepted whatever the flag (the caller turns it on)."""
    if not isinstance(activation, str):
        raise TypeError(f"activation must be a string (or a list of them), got {type(activation).__name__}")
    if isinstance(axes, str) or not all(isinstance(a, str) for a in axes):
        raise TypeError(f"axes must be a sequence of axis names, got {axes!r}")
    axes = tuple(axes)
    template = ATP_ACTIVATIONS.get(activation, activation)
    layered = "{L}" in template
    n_layers = model.cfg.n_layers
    names = [template.format(L=layer) for layer in range(n_layers)] if layered else [template]
    flag = gating_flag(names[0])
    # a flag-gated hook exists once the run turns its flag on (the model refuses a flag it cannot take)
    gated = flag is not None and hook_pattern(names[0]) in FLAG_GATED_HOOKS and int(names[0].split(".")[1]) < n_layers
    if names[0] not in model.hook_dict and not gated:
        if not layered and activation not in model.hook_dict and "." not in activation:
            from ...suggest import did_you_mean

            raise ValueError(f"unknown activation {activation!r}{did_you_mean(activation, ATP_ACTIVATIONS)}: give "
                             f"one of {', '.join(ATP_ACTIVATIONS)}, a hook name template containing {{L}}, or a full "
                             "hook name")
        raise KeyError(unknown_name_message(names[0], model.hook_dict))
    try:
        act_axes = tuple(AXIS_NAMES.get(a, a) for a in hook_shape(names[0], model.hook_flags, model.cfg).split()[1:])
        known_shape = True
        if hook_axes is not None:
            raise ValueError(f"hook_axes is for hooks whose axes glassbox does not know; {names[0]} has axes "
                             f"({' '.join(act_axes)}) after batch")
    except KeyError:
        known_shape = False
        given = axes if hook_axes is None else tuple(hook_axes)
        act_axes = tuple(a for a in given if a != "layer")
    if layered:
        if not axes or axes[0] != "layer":
            raise ValueError(f"axes for {template} start with 'layer' (one hook per layer), got {axes!r}")
    elif "layer" in axes:
        raise ValueError(f"{names[0]} is one hook point, so its axes have no 'layer': got {axes!r}")
    node_axes = axes[1:] if layered else axes
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes repeat: {axes!r}")
    if not known_shape and len(set(act_axes)) != len(act_axes):
        raise ValueError(f"hook_axes repeat: {act_axes!r}")
    cfg = model.cfg
    for axis in node_axes:
        if axis == "head" and "kv_head" in act_axes:
            raise ValueError(f"{template} has a kv_head axis, not head: this model's {cfg.n_heads} query heads share "
                             f"n_key_value_heads={cfg.n_key_value_heads} key/value heads (grouped-query attention). "
                             "Ask for 'kv_head' (each kv head at once for all the query heads that read it), or build "
                             "the model with ungroup_grouped_query_attention=True for keys and values per query head")
        if axis == "d_mlp":
            raise ValueError(f"the MLP's hidden axis is called 'neuron' in results; use 'neuron' for {template}")
        if axis not in act_axes or axis.isdigit() or axis in NOT_NODE_AXES:
            choices = [a for a in act_axes if not a.isdigit()]
            raise ValueError(f"axis {axis!r} is not an axis of {template} ({' '.join(act_axes)} after batch); "
                             f"choose from {choices}" + ("" if known_shape else
                                                         " (hook_axes names this hook's axes after batch)"))
    return NodeSpec(activation, names, layered, act_axes, axes, flag, known_shape)


def expected_shape(model, spec: NodeSpec, n_prompts: int, seq_len: int) -> Optional[tuple]:
    """[batch *act_dims] of the spec's hooks, or None where HOOK_SHAPES does not know the hook."""
    if not spec.known_shape:
        return None
    sizes = axis_sizes(model.cfg, n_prompts, seq_len)
    sizes["neuron"] = sizes["d_mlp"]
    return (n_prompts, *(int(a) if a.isdigit() else sizes[a] for a in spec.act_axes))


def check_act(spec: NodeSpec, name: str, value: Tensor, what: str) -> None:
    """Refuse an activation whose number of axes does not match the named hook axes."""
    if value.ndim != len(spec.act_axes) + 1:
        raise ValueError(f"{what} {name} has shape {tuple(value.shape)} ({value.ndim} axes with batch), but its "
                         f"axes are named ({' '.join(spec.act_axes)}) after batch; give hook_axes naming every axis "
                         "after batch")


def to_nodes(spec: NodeSpec, score: Tensor) -> Tensor:
    """score [batch *act_axes] -> [batch *node_axes]: summed over the axes that are not node axes,
    then ordered as the result's axes."""
    keep = [a for a in spec.act_axes if a in spec.node_axes]
    drop = [1 + i for i, a in enumerate(spec.act_axes) if a not in spec.node_axes]
    if drop:
        score = score.sum(dim=drop)
    order = [keep.index(a) for a in spec.node_axes]
    return score.permute(0, *(1 + i for i in order))


def axis_labels(model, axis: str, size: int, tokens: Tensor) -> list:
    """Labels as the sweeps give them: layer/head/neuron numbers, the first prompt's tokens for
    positions, "i (q a-b)" for kv heads under grouped-query attention."""
    if axis in ("pos", "query_pos", "key_pos"):
        return position_labels(model, tokens[0])
    if axis == "kv_head":
        g = model.cfg.n_kv_groups
        return [f"{i} (q {i * g}-{i * g + g - 1})" if g > 1 else str(i) for i in range(size)]
    return [str(i) for i in range(size)]


def check_stackable(specs: list) -> None:
    """Stacked activations share one grid: the same node axes and sizes (checked by the caller on
    the values); refuse a kv_head activation in a grid over query heads, as the sweeps do."""
    first = specs[0]
    for spec in specs:
        if spec.axes != first.axes:
            raise ValueError(f"stacked activations share one set of axes: {spec.activation} has {spec.axes}, "
                             f"{first.activation} {first.axes}")
        if spec.layered != first.layered:
            raise ValueError("stacked activations are all per-layer templates or all single hooks")
