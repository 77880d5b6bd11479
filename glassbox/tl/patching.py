"""TransformerLens's ``patching`` module on glassbox's batched patching engine.

Every ``get_act_patch_*`` takes ``(model, corrupted_tokens, clean_cache, patching_metric)`` with
TransformerLens's metric contract: ``patching_metric(patched_logits [batch pos d_vocab]) -> scalar``
for one patched run (often a mean over the batch). It returns a plain tensor of TransformerLens's
shape and axis order, in the default float dtype (float32), on the model's device.

Underneath, ``glassbox.interp.patching.activation_patch`` runs many patch variants side by side in
one batched forward, and ``VariantMetric`` calls the metric on each variant's own rows: the values
are those of TransformerLens's one-patch-per-forward loop, up to float rounding of the batched
matmuls. Differences from TransformerLens:
- the sweeps run under ``torch.no_grad`` (TransformerLens reads ``.item()`` of each value anyway);
- ``generic_activation_patch`` with one of this module's patch setters runs on the engine; with any
  other ``patch_setter`` (an arbitrary function of the activation, which the engine's slice masks
  cannot express) it runs TransformerLens's loop, one forward per index, the setter given a copy;
- with ``index_df`` and a known setter, the engine sweeps the whole grid of the setter's axes and the
  result picks the requested rows (negative indices as in the loop): exact, but it costs the whole
  grid.
"""

import itertools
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..interp.act_names import act_name
from ..models.hook_shapes import hook_shape
from ..interp.patching import VariantMetric, activation_patch

# TransformerLens's index axis names -> glassbox's sweep axes
AXIS_NAMES = {"layer": "layer", "pos": "pos", "head_index": "head", "head": "head", "dest_pos": "query_pos",
              "src_pos": "key_pos"}


# -- patch setters: TransformerLens's, each also naming the engine axes it patches ----------------
def layer_pos_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, pos]: the activation [batch pos ...] at ``pos``."""
    _, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, pos, head]: a head's vector (q, k, v, z) [batch pos head ...] at one position."""
    _, pos, head = index
    corrupted_activation[:, pos, head] = clean_activation[:, pos, head]
    return corrupted_activation


def layer_head_vector_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head]: a head's vector (q, k, v, z) at every position."""
    _, head = index
    corrupted_activation[:, :, head] = clean_activation[:, :, head]
    return corrupted_activation


def layer_head_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head]: a head's whole pattern [batch head dest src]."""
    _, head = index
    corrupted_activation[:, head] = clean_activation[:, head]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head, dest_pos]: one query row of a head's pattern."""
    _, head, dest = index
    corrupted_activation[:, head, dest, :] = clean_activation[:, head, dest, :]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(corrupted_activation, index, clean_activation):
    """index = [layer, head, dest_pos, src_pos]: one entry of a head's pattern."""
    _, head, dest, src = index
    corrupted_activation[:, head, dest, src] = clean_activation[:, head, dest, src]
    return corrupted_activation


ENGINE_AXES = {
    layer_pos_patch_setter: ("layer", "pos"),
    layer_pos_head_vector_patch_setter: ("layer", "pos", "head"),
    layer_head_vector_patch_setter: ("layer", "head"),
    layer_head_pattern_patch_setter: ("layer", "head"),
    layer_head_pos_pattern_patch_setter: ("layer", "head", "query_pos"),
    layer_head_dest_src_pos_pattern_patch_setter: ("layer", "head", "query_pos", "key_pos"),
}


def _template(activation_name: str) -> str:
    name = act_name(activation_name, 0)
    if not name.startswith("blocks.0."):
        raise ValueError(f"activation_name {activation_name!r} is not a per-layer activation")
    return "blocks.{L}." + name[len("blocks.0."):]


def _axis_size(model, tokens: Tensor, axis: str) -> int:
    gcfg = getattr(model.cfg, "glassbox", model.cfg)  # glassbox's view of a TransformerLens config
    return {"layer": gcfg.n_layers, "head": gcfg.n_heads, "kv_head": gcfg.n_key_value_heads}.get(axis, tokens.shape[-1])


def _grouped_axes(model, template: str, axes):
    """Engine axes with "head" read as "kv_head" where the hook holds grouped keys or values (grouped-query
    attention: TransformerLens indexes past the kv heads there; glassbox sweeps each kv head)."""
    if axes is None or "head" not in axes:
        return axes
    gcfg = getattr(model.cfg, "glassbox", model.cfg)
    if "kv_head" not in hook_shape(template.format(L=0), model.hook_flags, gcfg).split():
        return axes
    return tuple("kv_head" if a == "head" else a for a in axes)


def _out(values: Tensor, model) -> Tensor:
    return values.to(device=model.cfg_device(), dtype=torch.get_default_dtype())


def _index_frame(sizes: Sequence[int], names: Sequence[str]):
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("return_index_df needs pandas (pip install pandas)") from None
    return pd.DataFrame(list(itertools.product(*(range(n) for n in sizes))), columns=list(names))


def generic_activation_patch(model, corrupted_tokens, clean_cache, patching_metric: Callable, patch_setter: Callable,
                             activation_name: str, index_axis_names: Optional[Sequence[str]] = None,
                             index_df=None, return_index_df: bool = False):
    """Patch ``activation_name`` (TransformerLens shorthand: "resid_pre", "z", "pattern", ...) from
    ``clean_cache`` into the corrupted run at every index, with ``patch_setter``.

    The indices are the grid of ``index_axis_names`` (from layer, pos, head_index/head, dest_pos,
    src_pos; layer first), giving a tensor of that grid's shape, or the rows of ``index_df`` (a pandas
    DataFrame, columns in the setter's order), giving a flat tensor with one value per row.
    ``return_index_df`` also returns the DataFrame of indices.
    """
    if (index_df is None) == (index_axis_names is None):
        raise ValueError("give exactly one of index_axis_names (a grid) and index_df (explicit rows)")
    template = _template(activation_name)
    tokens, _ = model.input_to_tokens(corrupted_tokens, None, None, "right")
    metric = VariantMetric(patching_metric)
    axes = _grouped_axes(model, template, ENGINE_AXES.get(patch_setter))
    if index_df is None:
        names = tuple(index_axis_names)
        unknown = [n for n in names if n not in AXIS_NAMES]
        if unknown:
            raise ValueError(f"index_axis_names {unknown} are not among {list(AXIS_NAMES)}")
        grouped = axes is not None and "kv_head" in axes
        sizes = [_axis_size(model, tokens, "kv_head" if grouped and AXIS_NAMES[n] == "head" else AXIS_NAMES[n])
                 for n in names]
        if axes is not None and sizes == [_axis_size(model, tokens, a) for a in axes] and names[0] == "layer":
            values = _out(activation_patch(model, corrupted_tokens, clean_cache, metric, template, axes).values,
                          model)
        else:
            rows = list(itertools.product(*(range(n) for n in sizes)))
            values = _out(_patch_by_forwards(model, tokens, clean_cache, metric, patch_setter, template, rows),
                          model).reshape(sizes)
        return (values, _index_frame(sizes, names)) if return_index_df else values
    rows = [tuple(int(i) for i in row) for row in index_df.itertuples(index=False)]
    if not rows:
        values = torch.empty(0, device=tokens.device)
        return (values, index_df) if return_index_df else values
    if axes is not None and all(len(row) == len(axes) for row in rows):
        _check_rows(rows, [_axis_size(model, tokens, a) for a in axes], axes)  # before the sweep, on the host
        grid = activation_patch(model, corrupted_tokens, clean_cache, metric, template, axes).values
        picked = torch.tensor(rows, dtype=torch.long, device=grid.device).reshape(-1, len(axes))
        values = grid[tuple(picked.unbind(1))]
    else:
        values = _patch_by_forwards(model, tokens, clean_cache, metric, patch_setter, template, rows)
    values = _out(values, model)
    return (values, index_df) if return_index_df else values


def _check_rows(rows: list, sizes: list, axes) -> None:
    for row in rows:
        for value, size, axis in zip(row, sizes, axes):
            if not -size <= value < size:
                raise ValueError(f"index_df row {row}: {axis} index {value} is outside [-{size}, {size})")


def _patch_by_forwards(model, tokens, clean_cache, metric: VariantMetric, patch_setter: Callable, template: str,
                       rows: list) -> Tensor:
    """TransformerLens's loop, for setters the engine cannot express: one forward per index."""
    if not callable(patch_setter):
        raise TypeError(f"patch_setter must be callable, got {type(patch_setter).__name__}")
    values = []
    with torch.no_grad():
        for index in rows:
            name = template.format(L=index[0])
            clean = clean_cache[name]

            def patch(act, hook, index=list(index), clean=clean):
                return patch_setter(act.clone(), index, clean)

            values.append(metric.values(model.run_with_hooks(tokens, fwd_hooks=[(name, patch)]), tokens.shape[0]))
    if not values:
        return torch.zeros(0, device=tokens.device)
    return torch.cat(values)


def _named(setter: Callable, activation: str, names: tuple, what: str, shape: str) -> Callable:
    def get_act_patch(model, corrupted_tokens, clean_cache, patching_metric, **options):
        return generic_activation_patch(model, corrupted_tokens, clean_cache, patching_metric, patch_setter=setter,
                                        activation_name=activation, index_axis_names=names, **options)

    get_act_patch.__doc__ = (f"Activation patching of {what}: a tensor [{shape}]. "
                             "See generic_activation_patch.")
    return get_act_patch


get_act_patch_resid_pre = _named(layer_pos_patch_setter, "resid_pre", ("layer", "pos"),
                                 "the residual stream entering each block, by position", "n_layers pos")
get_act_patch_resid_mid = _named(layer_pos_patch_setter, "resid_mid", ("layer", "pos"),
                                 "the residual stream between attention and MLP, by position", "n_layers pos")
get_act_patch_attn_out = _named(layer_pos_patch_setter, "attn_out", ("layer", "pos"),
                                "each attention layer's output, by position", "n_layers pos")
get_act_patch_mlp_out = _named(layer_pos_patch_setter, "mlp_out", ("layer", "pos"),
                               "each MLP layer's output, by position", "n_layers pos")
get_act_patch_attn_head_out_by_pos = _named(layer_pos_head_vector_patch_setter, "z", ("layer", "pos", "head"),
                                            "each head's output z, by position", "n_layers pos n_heads")
get_act_patch_attn_head_q_by_pos = _named(layer_pos_head_vector_patch_setter, "q", ("layer", "pos", "head"),
                                          "each head's queries, by position", "n_layers pos n_heads")
get_act_patch_attn_head_k_by_pos = _named(layer_pos_head_vector_patch_setter, "k", ("layer", "pos", "head"),
                                          "each head's keys, by position", "n_layers pos n_heads")
get_act_patch_attn_head_v_by_pos = _named(layer_pos_head_vector_patch_setter, "v", ("layer", "pos", "head"),
                                          "each head's values, by position", "n_layers pos n_heads")
get_act_patch_attn_head_pattern_by_pos = _named(
    layer_head_pos_pattern_patch_setter, "pattern", ("layer", "head_index", "dest_pos"),
    "one query row of each head's pattern", "n_layers n_heads dest_pos")
get_act_patch_attn_head_pattern_dest_src_pos = _named(
    layer_head_dest_src_pos_pattern_patch_setter, "pattern", ("layer", "head_index", "dest_pos", "src_pos"),
    "each entry of each head's pattern", "n_layers n_heads dest_pos src_pos")
get_act_patch_attn_head_out_all_pos = _named(layer_head_vector_patch_setter, "z", ("layer", "head"),
                                             "each head's output z at every position", "n_layers n_heads")
get_act_patch_attn_head_q_all_pos = _named(layer_head_vector_patch_setter, "q", ("layer", "head"),
                                           "each head's queries at every position", "n_layers n_heads")
get_act_patch_attn_head_k_all_pos = _named(layer_head_vector_patch_setter, "k", ("layer", "head"),
                                           "each head's keys at every position", "n_layers n_heads")
get_act_patch_attn_head_v_all_pos = _named(layer_head_vector_patch_setter, "v", ("layer", "head"),
                                           "each head's values at every position", "n_layers n_heads")
get_act_patch_attn_head_pattern_all_pos = _named(layer_head_pattern_patch_setter, "pattern", ("layer", "head_index"),
                                                 "each head's whole pattern", "n_layers n_heads")


def _stacked(model, corrupted_tokens, clean_cache, metric, activations: list, axes: tuple) -> Tensor:
    """Sweeps of several activations over one corrupted run: [component *axes]."""
    return _out(activation_patch(model, corrupted_tokens, clean_cache, VariantMetric(metric), activations,
                                 axes).values, model)


def get_act_patch_attn_head_all_pos_every(model, corrupted_tokens, clean_cache, metric) -> Tensor:
    """z, q, k, v and pattern of every head, all positions at once, stacked: [5 n_layers n_heads]."""
    return _stacked(model, corrupted_tokens, clean_cache, metric, ["z", "q", "k", "v", "pattern"], ("layer", "head"))


def get_act_patch_attn_head_by_pos_every(model, corrupted_tokens, clean_cache, metric) -> Tensor:
    """z, q, k, v of every head by position, and each pattern row by query position: [5 n_layers pos n_heads]."""
    vectors = _stacked(model, corrupted_tokens, clean_cache, metric, ["z", "q", "k", "v"], ("layer", "pos", "head"))
    pattern = _stacked(model, corrupted_tokens, clean_cache, metric, ["pattern"], ("layer", "head", "query_pos"))
    return torch.cat([vectors, pattern.transpose(-2, -1)])


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, metric) -> Tensor:
    """resid_pre, attn_out and mlp_out by position, stacked: [3 n_layers pos]."""
    return _stacked(model, corrupted_tokens, clean_cache, metric, ["resid_pre", "attn_out", "mlp_out"],
                    ("layer", "pos"))


def make_df_from_ranges(column_max_ranges: Sequence[int], column_names: Sequence[str]):
    """A DataFrame of every combination of range(max) per column, the last column varying fastest."""
    return _index_frame(column_max_ranges, column_names)


for _name, _fn in list(globals().items()):
    if _name.startswith("get_act_patch_"):
        _fn.__name__ = _fn.__qualname__ = _name
