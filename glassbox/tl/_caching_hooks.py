"""get_caching_hooks: TransformerLens's hook pairs that fill a dict with detached activations.

``get_caching_hooks(model, names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice)`` returns
``(cache, fwd_hooks, bwd_hooks)``: one ``(name, fn)`` pair per hook point that ``names_filter`` selects
(None: all; a name; a list of names; a callable on names; glassbox's ``resolve_names``, so an unknown
name raises KeyError with the closest names, where TransformerLens selects nothing), in forward order.
Attached (``model.hooks(fwd_hooks, bwd_hooks)``, ``run_with_hooks``), each stores its activation,
detached and moved to ``device``, at ``cache[name]``; a backward pair stores the gradient at
``cache[name + "_grad"]``. ``remove_batch_dim`` keeps batch row 0; ``pos_slice`` (a ``Slice`` or what
``Slice`` takes) slices the position axis as ``run_with_cache`` does. A later firing of the same hook
(a second forward) overwrites the entry, as in TransformerLens.
"""

from typing import Optional


def get_caching_hooks(model, names_filter=None, incl_bwd: bool = False, device=None, remove_batch_dim: bool = False,
                      cache: Optional[dict] = None, pos_slice=None) -> tuple:
    from ..interp.cache import resolve_names
    from ._run_with_cache import POS_AXIS_3
    from .utils import Slice

    cache = {} if cache is None else cache
    if not isinstance(cache, dict):
        raise TypeError(f"get_caching_hooks(cache=...) takes a dict to fill, got {type(cache).__name__}")
    names = resolve_names(model, names_filter)
    pos_slice = Slice.unwrap(pos_slice)

    def saver(suffix: str):
        def save(tensor, hook) -> None:
            value = tensor.detach().to(device) if device is not None else tensor.detach()
            if remove_batch_dim:
                value = value[0]
            axis = -3 if hook.name.endswith(POS_AXIS_3) else -2
            if value.ndim >= -axis:
                value = pos_slice.apply(value, dim=axis)
            cache[hook.name + suffix] = value

        return save

    fwd_hooks = [(name, saver("")) for name in names]
    bwd_hooks = [(name, saver("_grad")) for name in names] if incl_bwd else []
    return cache, fwd_hooks, bwd_hooks
