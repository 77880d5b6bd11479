"""run_with_cache and cache_size: record activations during a forward pass, and predict their bytes.

Contract:
- ``names_filter`` is None (every hook), a hook name, a list of hook names, or a callable on names.
  An unknown name raises ``KeyError`` with the closest valid names; a flag-gated name (``hook_result``,
  ``hook_q_input``...) whose hook flag is off raises ``KeyError`` naming the flag and its setter. Only
  the hooks in ``model.hook_dict`` (those that fire under the model's flags) are cached or counted.
- Each activation is detached, moved to ``device`` and cast to ``dtype`` (floating tensors only) as it
  is cached, so a GPU run can cache to CPU in float16 without holding a full GPU copy. When other
  hooks are attached it is also copied, so no later hook that edits a tensor in place can change
  what was cached; with none, the forward's own tensor is kept (nothing else can edit it), which
  halves the allocations of a full cache. With ``stop_at_layer`` the returned residual stream is then
  the same tensor as the last cached one.
- With ``return_type=None`` nothing after the last requested activation is needed, so the forward
  stops as soon as that activation is cached; a requested ``ln_final.*`` or ``unembed.*`` hook is still
  run (the output stays None). Under ``use_split_qkv_input`` ln1 runs three times per block (q, k, v
  inputs) and the cache keeps the last (v's), as TransformerLens does; a forward caching ln1 then runs
  to the end instead of stopping at ln1's first call. With ``stop_at_layer`` the forward runs only the
  blocks before it (the output is the residual stream there); an explicitly named activation beyond
  that point is an error rather than a silently missing key.
- ``incl_bwd=True`` runs a backward pass on the loss and caches gradients as ``<name>_grad``.
  Parameter ``.grad`` fields are left exactly as they were.
- Before any forward runs, the cache's bytes are predicted exactly (``cache_size``, for any filter)
  and compared with the memory available on the device the cache lands on (CPU: MemAvailable of
  /proc/meminfo; CUDA: ``torch.cuda.mem_get_info`` plus what torch's allocator holds unused). A cache
  that cannot fit raises ``CacheMemoryError`` (a ``MemoryError``) with both numbers and the ways out;
  ``check_memory=False`` skips the check. On a model placed across devices
  (``glassbox.models.devices``), ``device=None`` leaves each activation on its part's device and
  checks each device's share there; ``device=`` gathers the whole cache on that device. Hook points
  added to a model after it was built (a spliced
  SAE's, for instance) have no ``HOOK_SHAPES`` entry: they are cached, but their bytes are not counted. A cache that fits but exceeds ``CACHE_BUDGET_BYTES`` (set
  it to change the budget) warns with the predicted size and how to filter.

Footgun: the forward runs in the caller's grad mode, so the returned output keeps its autograd graph
(and the activations it holds) unless the call is wrapped in ``torch.no_grad()``; the cached copies
never do. Caching ``hook_attn_scores`` or ``hook_pattern`` makes attention materialise the
[batch head query_pos key_pos] pattern instead of running the fused kernel: that is the memory the
size estimate reports.
"""

import math
import os
import warnings
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..models.devices import hook_device, plan_of
from ..models.hook_shapes import axis_sizes, hook_shape
from .activation_cache import ActivationCache

CACHE_BUDGET_BYTES = 4 * 2**30  # warn above this many bytes (the cache still fits in memory)

NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]


class CacheSizeWarning(UserWarning):
    """A cache would be larger than ``CACHE_BUDGET_BYTES``."""


class CacheMemoryError(MemoryError):
    """A cache would need more memory than its device has available; raised before the forward."""


class _StopForward(Exception):
    """Raised from a caching hook once every requested activation is in hand."""


def resolve_names(model, names_filter: NamesFilter) -> list:
    """Hook names selected by a filter, in ``hook_dict`` order; unknown names raise ``KeyError``."""
    if names_filter is None:
        return list(model.hook_dict)
    if isinstance(names_filter, str):
        return model.resolve_hook_names(names_filter)
    if callable(names_filter):
        return model.resolve_hook_names(names_filter)
    if isinstance(names_filter, (list, tuple, set, frozenset)):
        names = []
        for name in names_filter:
            if not isinstance(name, str):
                raise TypeError(f"names_filter entries must be hook names, got {name!r}")
            names += [n for n in model.resolve_hook_names(name) if n not in names]
        return names
    raise TypeError(f"names_filter must be None, a hook name, a list of names or a callable, "
                    f"got {type(names_filter).__name__}")


def cache_size(model, input_shape, names_filter: NamesFilter = None, dtype: Optional[torch.dtype] = None,
               incl_bwd: bool = False) -> int:
    """Bytes a cache of ``names_filter`` would take for tokens of ``input_shape`` (batch, pos).

    Computed from ``HOOK_SHAPES`` without running the model. ``input_shape`` may also be a token
    tensor. ``dtype`` is the cache dtype (default: the model's).
    """
    if isinstance(input_shape, Tensor):
        input_shape = tuple(input_shape.shape)
    input_shape = tuple(input_shape)
    if len(input_shape) == 1:
        input_shape = (1, *input_shape)
    if len(input_shape) != 2 or not all(isinstance(n, int) and n > 0 for n in input_shape):
        raise ValueError(f"input_shape must be (batch, pos) positive ints, got {input_shape!r}")
    batch, pos = input_shape
    if dtype is None:
        dtype = next(model.parameters()).dtype
    item = torch.empty((), dtype=dtype).element_size()
    sizes = axis_sizes(model.cfg, batch, pos)
    total = 0
    for name in resolve_names(model, names_filter):
        try:
            shape = hook_shape(name, getattr(model, "hook_flags", None), model.cfg)
        except KeyError:
            raise KeyError(f"hook {name!r} has no entry in HOOK_SHAPES, so its size is unknown") from None
        total += math.prod(_axis_size(axis, sizes, model.cfg, name) for axis in shape.split())
    return total * item * (2 if incl_bwd else 1)


def _axis_size(axis: str, sizes: dict, cfg, name: str) -> int:
    if axis.isdigit():
        return int(axis)
    if axis in sizes:
        return sizes[axis]
    value = getattr(cfg, axis, None)
    if not isinstance(value, int):
        raise ValueError(f"axis {axis!r} of hook {name!r} has no size in the config")
    return value


def run_with_cache(model, input: Union[str, list, Int[Tensor, "batch pos"], Float[Tensor, "batch pos d_model"]],
                   names_filter: NamesFilter = None, device=None,
                   dtype: Optional[torch.dtype] = None, remove_batch_dim: bool = False, incl_bwd: bool = False,
                   stop_at_layer: Optional[int] = None, return_type: Optional[str] = "logits",
                   attention_mask: Optional[Tensor] = None, prepend_bos: Optional[bool] = None,
                   padding_side: Optional[str] = "right", check_memory: bool = True, **forward_kwargs) -> tuple:
    """Run the model and cache activations: returns (output, ActivationCache).

    Args:
        input: token ids [batch pos], a string or a list of strings (padded, with a mask); with
            ``start_at_layer`` (a forward keyword) the residual stream entering that block [batch pos d_model].
        names_filter: which hooks to cache (see module docstring).
        device, dtype: where and how each activation is stored, applied as it is cached.
        remove_batch_dim: drop the batch axis (batch size must be 1).
        incl_bwd: also cache gradients of the loss as ``<name>_grad``.
        stop_at_layer, return_type, **forward_kwargs: as for the model's forward.
        check_memory: refuse (``CacheMemoryError``) a cache larger than the memory available on its
            device; False runs anyway.
    """
    # Checked here, not in the first caching hook, so a bad value fails before the forward starts.
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype (activations are cast to it), got {dtype!r}")
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device {device!r} is not a torch device: {err}") from None
    if forward_kwargs.get("start_at_layer") is not None:
        # the input is the residual stream entering that block [batch pos d_model] (the forward checks it);
        # the cache's tokens are the forward's tokens= (for a loss), if given
        if not isinstance(input, Tensor) or input.ndim != 3:
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"with start_at_layer, input is the residual stream [batch pos d_model], got {got}")
        run_input, tokens, shape = input, forward_kwargs.get("tokens"), tuple(input.shape[:2])
    else:
        tokens, attention_mask = model.input_to_tokens(input, attention_mask, prepend_bos, padding_side)
        run_input, shape = tokens, tuple(tokens.shape)
    names = resolve_names(model, names_filter)
    _check_budget(model, shape, names, device, dtype, incl_bwd, check_memory)
    if stop_at_layer is not None and names_filter is not None and not callable(names_filter):
        _check_reachable(names, stop_at_layer, model.cfg.n_layers)
    if remove_batch_dim and shape[0] != 1:
        raise ValueError(f"remove_batch_dim needs a batch of 1, got {shape[0]} sequences")
    if incl_bwd and (stop_at_layer is not None):
        raise ValueError("incl_bwd needs the loss, so it cannot be combined with stop_at_layer")

    store: dict = {}
    pending = set(names)
    # With stop_at_layer the output is the residual stream there, so the forward must reach it.
    stop_early = return_type is None and stop_at_layer is None and not incl_bwd
    flags = getattr(model, "hook_flags", None)
    if flags is not None and flags.use_split_qkv_input and any(".ln1." in n for n in names):
        stop_early = False  # ln1's first call (q's input) is not the one a cache keeps (v's)
    # return_type=None returns before the final norm, so a requested ln_final hook needs the forward
    # to go on into it (stopping there, once everything is cached: the unembedding never runs).
    forward_type = return_type
    if return_type is None and stop_at_layer is None and any(n.startswith(("ln_final.", "unembed.")) for n in names):
        forward_type = "logits"

    # The forward never edits an activation in place, so only another hook could change a stored
    # tensor later: with none attached, the forward's own tensor is kept (no second allocation and
    # copy pass, the main cost of a full cache). Gradients are always copied: autograd may
    # accumulate into the buffer it handed to the hook.
    copy_acts = model.has_hooks

    def save(store_name: str, copy: bool = True):
        def hook(act: Tensor, hook) -> None:
            value = act.detach().to(device=device, dtype=dtype if act.is_floating_point() else None, copy=copy)
            store[store_name] = value[0] if remove_batch_dim else value
            pending.discard(store_name)
            if stop_early and not pending:
                raise _StopForward
        return hook

    fwd = [(name, save(name, copy_acts)) for name in names]
    bwd = [(name, save(name + "_grad")) for name in names] if incl_bwd else []
    kwargs = dict(attention_mask=attention_mask, stop_at_layer=stop_at_layer, **forward_kwargs)
    with model.hooks(fwd, bwd):
        if incl_bwd:
            output = _forward_backward(model, run_input, return_type, kwargs)
        else:
            try:
                output = model(run_input, return_type=forward_type, **kwargs)
            except _StopForward:
                output = None
            if return_type is None:
                output = None
    cache = ActivationCache(store, model, has_batch_dim=not remove_batch_dim, tokens=tokens,
                            attention_mask=attention_mask)
    return output, cache


def _forward_backward(model, tokens, return_type: Optional[str], kwargs: dict):
    """Forward with the loss, then backward through it without touching any parameter's .grad."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("incl_bwd needs gradients, but no parameter of the model requires grad")
    with torch.enable_grad():
        logits, loss = model(tokens, return_type="both", **kwargs)
        # autograd.grad fires the hook points' gradient hooks and leaves parameter .grad untouched.
        torch.autograd.grad(loss, params, allow_unused=True)
    logits, loss = logits.detach(), loss.detach()
    return {"logits": logits, "loss": loss, "both": (logits, loss), None: None}[return_type]


def _check_budget(model, shape: tuple, names: list, device, dtype, incl_bwd: bool, check_memory: bool) -> None:
    # Hook points added to a built model (a spliced SAE's, say) have no HOOK_SHAPES entry: their sizes
    # are unknown, so the check counts the others (cache_size itself refuses such names).
    flags = getattr(model, "hook_flags", None)
    names = [name for name in names if _has_shape(name, flags, model.cfg)]
    size = cache_size(model, shape, names, dtype, incl_bwd)
    if device is not None or plan_of(model) is None:
        groups = {device if device is not None else next(model.parameters()).device: names}
    else:  # left in place on a model placed across devices: each activation stays on its part's device
        groups = {}
        for name in names:
            groups.setdefault(hook_device(model, name), []).append(name)
    for where, group in groups.items():
        part = size if len(groups) == 1 else cache_size(model, shape, group, dtype, incl_bwd)
        free = available_bytes(where) if check_memory else None
        if free is not None and part > free:
            raise CacheMemoryError(
                f"run_with_cache would cache {part} bytes ({part / 2**30:.2f} GiB) of {len(group)} activation(s) "
                f"for input of shape {shape} on {where}, but {free} bytes ({free / 2**30:.2f} GiB) are available "
                "there. Cache less with names_filter (model.cache_size(shape, names_filter) predicts the bytes), a "
                "smaller batch or shorter input, dtype=torch.float16, or device= a device with room (e.g. 'cpu' "
                "for a GPU model); or pass check_memory=False to run anyway.")
    if size > CACHE_BUDGET_BYTES:
        warnings.warn(
            f"caching {len(names)} activation(s) for input of shape {shape} takes {size / 2**30:.2f} GiB, "
            f"over the budget of {CACHE_BUDGET_BYTES / 2**30:.2f} GiB "
            "(glassbox.interp.cache.CACHE_BUDGET_BYTES). Cache less with names_filter, e.g. "
            "names_filter=lambda name: name.endswith('hook_resid_post'), or pass dtype=torch.float16; "
            "model.cache_size(shape, names_filter) predicts the bytes before running.",
            CacheSizeWarning, stacklevel=3)


def _has_shape(name: str, flags, cfg) -> bool:
    try:
        hook_shape(name, flags, cfg)
        return True
    except KeyError:
        return False


def available_bytes(device) -> Optional[int]:
    """Bytes that can still be allocated on ``device``, or None where that is unknown (meta, MPS...)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        # torch's caching allocator keeps freed blocks reserved; they are free to this process.
        return free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # other POSIX systems: free physical pages (a lower bound: page cache is not counted)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_reachable(names: list, stop_at_layer: int, n_layers: int) -> None:
    end = stop_at_layer if stop_at_layer >= 0 else n_layers + stop_at_layer
    for name in names:
        parts = name.split(".")
        beyond = name.startswith(("ln_final", "unembed")) or (parts[0] == "blocks" and int(parts[1]) >= end)
        if beyond:
            raise ValueError(f"{name!r} is not computed with stop_at_layer={stop_at_layer}: the forward runs "
                             f"only blocks 0..{end - 1}")
