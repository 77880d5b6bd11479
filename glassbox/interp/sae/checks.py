"""Refusing SAE tensors that would compute a silently different number.

A NaN JumpReLU threshold makes ``pre > threshold`` false everywhere, so that feature never fires; a NaN
or inf in ``W_dec`` or ``b_dec`` reaches every output. ``non_finite(t)`` describes what is wrong with a
tensor (None when every value is finite); ``check_finite_state(sae, where)`` refuses an SAE whose
parameters or buffers hold one, naming the tensor. ``load_sae`` checks each tensor of the files it reads
(and again after casting to the dtype asked for and after folding statistics in); ``add_sae`` and
``evaluate_sae`` check the SAE they are given. Nothing checks at every forward (that would wait on the
device each time): an SAE changed in place after it is spliced is the caller's.
"""

from typing import Optional

import torch
from torch import Tensor


def non_finite(t: Tensor) -> Optional[str]:
    """'holds N non-finite value(s) (NaN, inf...; the first at index I)', or None when all are finite."""
    if not (t.is_floating_point() or t.is_complex()) or t.is_meta:  # a meta tensor holds no values
        return None
    bad = ~torch.isfinite(t)
    n = int(bad.sum())
    if n == 0:
        return None
    kinds = sorted({"NaN" if v != v else ("inf" if v > 0 else "-inf") for v in t[bad][:1000].tolist()})
    first = tuple(int(i) for i in bad.nonzero()[0].tolist()) if t.ndim else ()
    return (f"holds {n} non-finite value{'s' if n > 1 else ''} ({', '.join(kinds)}"
            f"{f'; the first at index {first}' if t.ndim else ''})")


WHY = "an SAE with it computes NaN or silently drops features, so it is refused"


def check_finite_state(sae, where: str, why: str = WHY) -> None:
    """Refuse, as ValueError naming ``where`` and the tensor, an SAE with a non-finite parameter or buffer."""
    for name, t in sae.state_dict().items():
        problem = non_finite(t.detach())
        if problem is not None:
            kind = "buffer" if name in dict(sae.named_buffers()) else "parameter"
            raise ValueError(f"{where}: {kind} {name!r} {problem}; {why}")
