"""run_with_cache with TransformerLens's arguments, mapped onto ``glassbox.interp.cache.run_with_cache``."""

FORWARD_ARGS = ("input", "return_type", "loss_per_token", "prepend_bos", "padding_side", "start_at_layer", "tokens",
                "shortformer_pos_embed", "attention_mask", "stop_at_layer", "past_kv_cache")
from .ActivationCache import ActivationCache

# TransformerLens slices pos_slice along this axis (from the end); every other activation: -2.
POS_AXIS_3 = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")


def tl_run_with_cache(model, model_args: tuple, names_filter=None, device=None, remove_batch_dim: bool = False,
                      incl_bwd: bool = False, reset_hooks_end: bool = True, clear_contexts: bool = False,
                      pos_slice=None, return_cache_object: bool = True, **model_kwargs):
    """(output, cache) with TransformerLens's arguments, mapped onto ``glassbox.interp.cache.run_with_cache``.

    - ``model_args`` are the forward's positional arguments in TransformerLens's order; the forward's
      keywords pass through.
    - ``names_filter``: None, a name, a list of names or a callable; unlike TransformerLens an unknown
      name raises KeyError (TransformerLens caches nothing for it, silently).
    - ``incl_bwd``: gradients of the loss (the forward runs with return_type "both"; the output is what
      return_type asked for); parameters' ``.grad`` are left unchanged (TransformerLens's
      ``backward()`` accumulates into them).
    - ``reset_hooks_end=False`` (leaving the caching hooks attached) is refused; ``clear_contexts``
      empties every hook point's ``ctx`` afterwards.
    - ``pos_slice``: a ``Slice`` (or what ``Slice`` takes) applied to each cached activation's position
      axis, as TransformerLens chooses it: third from the end for q, k, v, z and result, else second.
    - ``return_cache_object``: a ``glassbox.tl.ActivationCache`` (False: a plain dict).
    """
    from ..interp.cache import run_with_cache

    if not reset_hooks_end:
        raise ValueError("run_with_cache(reset_hooks_end=False) is not supported: glassbox always removes the "
                         "caching hooks it added; add your own with model.add_hook")
    if len(model_args) > len(FORWARD_ARGS):
        raise TypeError(f"run_with_cache got {len(model_args)} positional arguments for the forward; it takes "
                        f"at most {len(FORWARD_ARGS)}")
    for name, value in zip(FORWARD_ARGS, model_args):
        if name in model_kwargs:
            raise TypeError(f"run_with_cache got multiple values for the forward's argument {name!r}")
        model_kwargs[name] = value
    if "input" not in model_kwargs:
        raise TypeError("run_with_cache needs the model's input")
    if model_kwargs.pop("shortformer_pos_embed", None) is not None:
        raise ValueError("shortformer_pos_embed is not supported: glassbox has no shortformer positions")
    if model_kwargs.get("padding_side") is None:  # glassbox's run_with_cache defaults to "right"
        model_kwargs["padding_side"] = model.default_padding_side
    out, cache = run_with_cache(model, model_kwargs.pop("input"), names_filter=names_filter, device=device,
                                remove_batch_dim=remove_batch_dim, incl_bwd=incl_bwd, **model_kwargs)
    data = dict(cache.items())
    if pos_slice is not None:
        from .utils import Slice

        pos_slice = Slice.unwrap(pos_slice)
        for name, value in data.items():
            axis = -3 if name.removesuffix("_grad").endswith(POS_AXIS_3) else -2
            if value.ndim >= -axis:
                data[name] = pos_slice.apply(value, dim=axis)
    if clear_contexts:
        for point in model.hook_dict.values():
            point.ctx.clear()
    if not return_cache_object:
        return out, data
    return out, ActivationCache(data, model, has_batch_dim=not remove_batch_dim, tokens=cache.tokens,
                                attention_mask=cache.attention_mask)
