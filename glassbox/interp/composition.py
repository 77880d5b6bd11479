"""Composition scores: how much of one circuit's output the next circuit reads.

For two matrices L and R (here: FactoredMatrix circuits, L's output space = R's input space) the
composition score is ``||L @ R||_F / (||L||_F ||R||_F)`` (Elhage et al. 2021, "A Mathematical
Framework"): 1 when R reads exactly the directions L writes, in the same proportions, near 0 when
they are unrelated. Between an earlier head's OV circuit (left) and a later head's circuit (right):
- Q-composition: right = the later head's QK circuit (its queries read the earlier output);
- K-composition: right = QK^T (its keys read it);
- V-composition: right = the later head's OV circuit.

``composition_scores(left, right)`` computes the score for every pair of leading indices: with
``broadcast_dims`` (the default) the result is [*left leading, *right leading] (every left circuit
against every right one), otherwise the leading dims broadcast as tensors do.
``all_composition_scores(model, mode)`` is every head pair's score [layer head layer head], zero
wherever the right head's layer is not strictly later than the left head's (no composition there).

Neither full [d_model d_model] matrix is formed: ||M||_F and products are taken through the thin
factors ``collapse_l`` (S V^T) of the left and ``collapse_r`` (U S) of the right, which preserve the
norms exactly: U^T L R V' has the Frobenius norm of L R because U, V' have orthonormal columns
spanning L's column space and R's row space. The SVDs cost O(d_model d_head^2) per head.

Families: with grouped-query attention ``model.OV`` and ``model.QK`` repeat each key/value head's
weights for its query heads, so scores stay [layer head layer head] over query heads. Q- and
K-composition are refused for models with ``cfg.qk_norm`` (the QK circuit does not give their scores).

Footgun: a circuit with norm 0 (a head whose weights are zero) gives 0/0 = nan, as in TransformerLens.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from .factored_matrix import FactoredMatrix

MODES = ("Q", "K", "V")


def composition_scores(left: FactoredMatrix, right: FactoredMatrix, broadcast_dims: bool = True) -> Tensor:
    """||left @ right||_F / (||left||_F ||right||_F) for each leading index (see the module docstring).

    Args:
        left, right: FactoredMatrix [*l ldim mid] and [*r mid rdim]; left's rdim must equal right's ldim.
        broadcast_dims: True: result [*l *r], every left against every right; False: [broadcast(l, r)].
    """
    for what, m in (("left", left), ("right", right)):
        if not isinstance(m, FactoredMatrix):
            raise TypeError(f"composition_scores: {what} must be a FactoredMatrix, got {type(m).__name__}")
    l_lead, r_lead = tuple(left.shape[:-2]), tuple(right.shape[:-2])
    if left.shape[-1] != right.shape[-2]:
        raise ValueError(f"composition_scores needs left's rdim == right's ldim; left is {tuple(left.shape)}, "
                         f"right is {tuple(right.shape)}")
    thin_left = left.collapse_l()  # [*l k_l d]: same norm and same products on the right as left
    thin_right = right.collapse_r()  # [*r d k_r]
    if broadcast_dims:
        thin_left = thin_left.reshape(l_lead + (1,) * len(r_lead) + tuple(thin_left.shape[-2:]))
        thin_right = thin_right.reshape((1,) * len(l_lead) + r_lead + tuple(thin_right.shape[-2:]))
    else:
        try:
            torch.broadcast_shapes(l_lead, r_lead)
        except RuntimeError:
            raise ValueError(f"composition_scores with broadcast_dims=False: leading dims {l_lead} and {r_lead} "
                             "do not broadcast") from None
    product = thin_left @ thin_right
    l_norm = torch.linalg.matrix_norm(thin_left)
    r_norm = torch.linalg.matrix_norm(thin_right)
    return torch.linalg.matrix_norm(product) / l_norm / r_norm


def all_composition_scores(model, mode: str) -> Float[Tensor, "layer head layer head"]:
    """Q-, K- or V-composition score of every earlier head (first two axes) into every later head.

    ``scores[l1, h1, l2, h2]`` is the score of head (l1, h1)'s OV circuit into head (l2, h2)'s QK
    (mode "Q"), QK^T ("K") or OV ("V") circuit; it is 0 where l2 <= l1. Same definition and mask as
    TransformerLens's ``HookedTransformer.all_composition_scores``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    qk_norm = getattr(model.cfg, "qk_norm", None)
    if mode != "V" and qk_norm is not None:
        raise ValueError(f"{mode}-composition reads the QK circuit W_Q W_K^T, but this model normalises its queries "
                         f"and keys (qk_norm={qk_norm!r}): its scores are q_norm(x W_Q) . k_norm(x W_K), not x W_Q "
                         "W_K^T x^T; only V-composition applies")
    left = model.OV
    right = model.OV if mode == "V" else model.QK if mode == "Q" else model.QK.T
    scores = composition_scores(left, right, broadcast_dims=True)
    layers = torch.arange(model.cfg.n_layers, device=scores.device)
    later = layers[:, None, None, None] < layers[None, None, :, None]
    return torch.where(later, scores, torch.zeros_like(scores))
