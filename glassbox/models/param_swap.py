"""``swapped_parameter(parameter, values)``: a parameter holds other values inside a ``with`` block and
its own again after it, whatever happens inside.

The values are copied into the parameter (under no_grad), so the Parameter object itself stays: every
module that registers it (tied or aliased weights), an optimizer's reference, ``requires_grad`` and
``.grad`` are untouched, unlike ``torch.func.functional_call``, which replaces registrations and on a
module registered under two names leaves the override installed. The originals are a clone held for the
block (memory: one copy of the parameter). Footgun: an in-place change to the parameter inside the block
is undone with the swap.
"""

from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def swapped_parameter(parameter: torch.nn.Parameter, values: torch.Tensor) -> Iterator[torch.nn.Parameter]:
    """Yields ``parameter`` holding ``values`` (same shape and dtype, any device); restores it on exit.

    Raises TypeError for a ``parameter`` that is not an ``nn.Parameter`` or ``values`` that are not a plain
    tensor, ValueError for another shape or dtype (a silent cast would change what the block computes),
    before anything is changed."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise TypeError(f"parameter must be a torch.nn.Parameter, got {type(parameter).__name__}")
    if isinstance(values, torch.nn.Parameter) or not isinstance(values, torch.Tensor):
        raise TypeError(f"the new values must be a plain torch.Tensor, got {type(values).__name__}")
    if values.shape != parameter.shape:
        raise ValueError(f"the new values' shape {tuple(values.shape)} differs from the parameter's shape "
                         f"{tuple(parameter.shape)}")
    if values.dtype != parameter.dtype:
        raise ValueError(f"the new values' dtype {values.dtype} differs from the parameter's dtype {parameter.dtype}")
    original = parameter.detach().clone()
    try:
        with torch.no_grad():
            parameter.copy_(values)
        yield parameter
    finally:
        with torch.no_grad():
            parameter.copy_(original)
