"""The one decision LayerNorm and RMSNorm share: did a hook change the scale they computed?

A norm computes its scale [batch pos 1] only to pass it through ``hook_scale``. If every hook there
only read it (caching, printing), the fused kernel computes the output, with no [batch pos d_model]
temporaries and the same bits as an unhooked run. If a hook returned another tensor or edited this one
in place (freezing the scale for attribution, say), the output must be recomputed from what the hook
left, so ``hooked_scale`` returns that tensor; otherwise None. A gradient hook on the scale needs the
scale on the autograd path to the output, so it too gets the recomputed output.
"""

from typing import Optional

from torch import Tensor


def hooked_scale(hook_point, scale: Tensor) -> Optional[Tensor]:
    """The scale after ``hook_point`` if a hook replaced or edited it, else None."""
    version = scale._version  # bumped by every in-place edit
    hooked = hook_point(scale)
    needs_grad_path = bool(hook_point.bwd_hooks) and hooked.requires_grad
    if hooked is scale and scale._version == version and not needs_grad_path:
        return None
    return hooked
