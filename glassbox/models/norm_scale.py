"""The one decision LayerNorm and RMSNorm share: did a hook change the scale they computed?

A norm computes its scale [batch pos 1] only to pass it through ``hook_scale``. If every hook there
only read it (caching, printing), the fused kernel computes the output, with no [batch pos d_model]
temporaries and the same bits as an unhooked run. If a hook returned another tensor or edited this one
in place (freezing the scale for attribution, say), the output must be recomputed from what the hook
left, so ``hooked_scale`` returns that tensor; otherwise None. A gradient hook on the scale needs the
scale on the autograd path to the output, so it too gets the recomputed output.
"""

from typing import Optional

import torch
from torch import Tensor


def hooked_scale(hook_point, scale: Tensor) -> Optional[Tensor]:
    """The scale after ``hook_point`` if a hook replaced or edited it, else None."""
    # The version counter is bumped by every in-place edit. Inference-mode tensors have none, so
    # there the (tiny, [batch pos 1]) scale is compared with a copy instead.
    tracked = not scale.is_inference()
    before = scale._version if tracked else scale.clone()
    hooked = hook_point(scale)
    if hooked is scale and not (hook_point.bwd_hooks and hooked.requires_grad):
        unchanged = scale._version == before if tracked else torch.equal(scale, before)
        if unchanged:
            return None
    return hooked
