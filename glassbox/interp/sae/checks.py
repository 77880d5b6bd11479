"""Refusing SAE tensors that would compute a silently different number.

A NaN JumpReLU threshold makes ``pre > threshold`` false everywhere, so that feature never fires; a NaN
or inf in ``W_dec`` or ``b_dec`` reaches every output. ``non_finite(t)`` describes what is wrong with a
tensor (None when every value is finite); ``check_finite_state(sae, where)`` refuses an SAE whose
parameters or buffers hold one, naming the tensor. ``load_sae`` checks each tensor of the files it reads
(and again after casting to the dtype asked for and after folding statistics in); ``add_sae`` and
``evaluate_sae`` check the SAE they are given. Finite parameters that compute NaN are refused too
(``check_computable``): a zero decoder row under ``rescale_acts_by_decoder_norm``, a gated SAE's
``exp(r_mag)`` overflowing. Nothing checks at every forward (that would wait on the
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
    check_computable(sae, where)


@torch.no_grad()
def check_computable(sae, where: str) -> None:
    """Refuse finite parameters that still compute NaN or inf: a zero decoder row when the activations are
    divided by the decoder norms (``rescaled``: 0 * inf), a gated SAE's ``exp(r_mag)`` (or its product with
    ``W_enc``) overflowing the dtype."""
    if getattr(sae, "rescaled", False) and not sae.W_dec.is_meta:
        zero = (sae.W_dec.norm(dim=-1) == 0).nonzero().flatten()
        if len(zero):
            raise ValueError(f"{where}: row {int(zero[0])} of 'W_dec' has norm 0 ({len(zero)} such rows); "
                             "rescale_acts_by_decoder_norm divides by it (0 * inf is NaN in every output where "
                             "the feature is kept), so it is refused")
    r_mag = getattr(sae, "r_mag", None)
    if isinstance(r_mag, Tensor) and not r_mag.is_meta:
        scale = r_mag.exp()
        bad = (~torch.isfinite(scale)).nonzero().flatten()
        if not len(bad):
            bad = (~torch.isfinite(sae.W_enc * scale)).any(0).nonzero().flatten()
        if len(bad):
            raise ValueError(f"{where}: parameter 'r_mag': exp(r_mag) overflows {r_mag.dtype} at feature "
                             f"{int(bad[0])} (r_mag={float(r_mag[bad[0]]):.4g}; the gated magnitude path multiplies "
                             "W_enc by it), so it is refused")


def check_one_head(sae, where: str) -> None:
    """Refuse an SAE trained on one head's values (SAELens's ``metadata.hook_head_index``): glassbox would
    run it on every head of the hook (SAELens's HookedSAETransformer does so without a word)."""
    head = sae.cfg.metadata.get("hook_head_index")
    if head is not None:
        raise ValueError(f"{where}: metadata hook_head_index={head!r}: the SAE was trained on one head's values "
                         f"at {sae.cfg.hook_name}, and run there it would read every head; refused (set "
                         "sae.cfg.metadata['hook_head_index'] = None to run it on every head)")
