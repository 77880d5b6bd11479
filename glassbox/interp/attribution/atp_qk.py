"""AtP*'s QK fix: a query or key node's effect through its head's attention pattern, with the
softmax recomputed exactly instead of linearised (Kramár et al. 2024, section 3.1.1).

A query or key reaches the metric only through the attention pattern. For a node n (one head's
queries or keys, at one position or all) AtP* takes

    sum over query rows t of (A_t(n clean) - A_t(corrupted)) . d metric / d A_t

where A_t is row t of the head's pattern on the corrupted run, recomputed with n set to its clean
value (everything else corrupted), and the gradient is the corrupted run's. Only the pattern's
softmax is exact; from the pattern on the estimate is linear, as AtP is.

Cost: scores are recomputed from the cached q and k (no forward of the model):
- queries: one recompute with every clean query; rows do not interact, so each position's node is
  its own row and the all-positions node is the sum of the rows;
- keys, all positions: one recompute with every clean key;
- keys, one position s at a time: only column s of each row changes, so with p = A_t, g its
  gradient, d the change of the score at s, and everything over keys j != s:
      sum_j (p'_j - p_j) g_j = (p'_s - p_s) (g_s - G_s),
      p_s = sigmoid(x_s - L_s), p'_s = sigmoid(x_s + d - L_s), L_s = log sum_{j != s} exp(x_j),
      G_s = sum_{j != s} exp(x_j - L_s) g_j,
  computed for every s at once without cancellation: the leave-one-out sums are taken relative to
  the row's largest score (so they are >= 1 whenever s is not that key), and for the largest key
  itself from the row with it removed.

The scores go through the attention's own q/k norms, rotation, scale and soft cap (so rotary and
qk-norm "head" models are handled), in float32 or wider. Refused: a per-head node under qk_norm
"full" (one head's patch would move every head's normalised keys), and nodes that index d_head.
Footgun: the attention's q/k norm and rotation hook points fire again during the recompute (user
hooks there run on the recomputed values).
"""

import torch
from torch import Tensor

from ...models.attention import causal_mask
from ...models.masks import positions_for
from .nodes import NodeSpec

QK_AXES = ("pos", "head", "kv_head")


def check_qk(model, spec: NodeSpec) -> None:
    extra = [a for a in spec.node_axes if a not in QK_AXES]
    if extra:
        raise ValueError(f"the QK fix recomputes the pattern per position and head; {spec.activation} with axes "
                         f"{spec.axes} indexes {extra}: use qk_fix=False (plain AtP for these nodes)")
    if model.cfg.qk_norm == "full" and any(a in spec.node_axes for a in ("head", "kv_head")):
        raise ValueError("qk_norm='full' normalises all heads' queries (keys) together, so one head's clean "
                         "query or key moves every head's scores; the QK fix per head is refused here: use axes "
                         "without 'head' or qk_fix=False")


def layer_inputs(model, layer: int, tokens: Tensor, key_mask) -> tuple:
    """(positions [batch pos], bool mask broadcastable to [batch head query_pos key_pos]) of a fresh forward."""
    n = tokens.shape[1]
    positions = positions_for(tokens, key_mask, 0)
    mask = model.layer_masks(key_mask, n, n, tokens.device)[model.cfg.layer_attn_type(layer)]
    return positions, (causal_mask(n, n, tokens.device) if mask is None else mask)


def attention_scores(attn, q: Tensor, k: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
    """Masked scores [batch head query_pos key_pos] (-inf where masked), float32 or wider, from hook_q
    [batch pos head d_head] and hook_k [batch pos kv_head d_head] values, as the attention computes them."""
    q, k = attn.normalize_qk(q, k)
    q, k = attn.rotate(q, k, positions, 0)
    wide = torch.promote_types(q.dtype, torch.float32)
    q, k = q.transpose(1, 2).to(wide), k.transpose(1, 2).to(wide)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q * attn.scale) @ k.transpose(-1, -2)
    if attn.soft_cap is not None:
        scores = torch.tanh(scores / attn.soft_cap) * attn.soft_cap
    return scores.masked_fill(~mask, float("-inf"))


def row_change(new_scores: Tensor, old_pattern: Tensor, grad: Tensor) -> Tensor:
    """[batch head query_pos]: sum over keys of (softmax(new) - old) * grad."""
    return ((new_scores.softmax(-1) - old_pattern) * grad).sum(-1)


def key_column_change(scores: Tensor, new_scores: Tensor, grad: Tensor) -> Tensor:
    """[batch head query_pos key_pos]: for each key s, sum over keys j of the change of row t's
    pattern times grad when only column s takes its new score (the closed form in the docstring)."""
    valid = torch.isfinite(scores)
    top, arg = scores.max(-1, keepdim=True)
    e1 = torch.where(valid, (scores - top).exp(), torch.zeros_like(scores))
    s1, t1 = e1.sum(-1, keepdim=True), (e1 * grad).sum(-1, keepdim=True)
    rest = s1 - e1  # >= 1 for every key but the row's largest
    lse_rest = top + rest.log()
    g_rest = (t1 - e1 * grad) / rest
    # The largest key itself: sums over the row without it.
    is_top = torch.zeros_like(valid).scatter_(-1, arg, True)
    without = scores.masked_fill(is_top, float("-inf"))
    top2 = without.max(-1, keepdim=True).values
    alone = ~torch.isfinite(top2)  # the row has a single key: its pattern is 1 whatever the score
    e2 = torch.where(torch.isfinite(without), (without - torch.where(alone, 0.0, top2)).exp(),
                     torch.zeros_like(without))
    s2, t2 = e2.sum(-1, keepdim=True), (e2 * grad).sum(-1, keepdim=True)
    lse_top = torch.where(alone, float("-inf"), top2 + s2.clamp_min(1e-300).log())
    g_top = torch.where(alone, 0.0, t2 / s2.clamp_min(1e-300))
    lse = torch.where(is_top, lse_top, lse_rest)
    g_other = torch.where(is_top, g_top, g_rest)
    delta = new_scores - scores
    old = torch.sigmoid(scores - lse)
    new = torch.sigmoid(scores + delta - lse)
    change = (new - old) * (grad - g_other)
    return torch.where(valid & torch.isfinite(new_scores), change, torch.zeros_like(change))


def qk_effect(model, spec: NodeSpec, layer: int, q: Tensor, k: Tensor, clean: Tensor, pattern_grad: Tensor,
              tokens: Tensor, key_mask) -> Tensor:
    """The QK-fixed effect of every node of ``spec`` (q or k) in ``layer``: [batch *node_axes]."""
    attn = model.blocks[layer].attn
    positions, mask = layer_inputs(model, layer, tokens, key_mask)
    which = "q" if spec.is_attention("q") else "k"
    clean = clean.to(q.device, q.dtype)
    by_pos = "pos" in spec.node_axes
    with torch.no_grad():
        scores = attention_scores(attn, q, k, positions, mask)
        grad = pattern_grad.to(scores.dtype)
        if which == "q":
            new = attention_scores(attn, clean, k, positions, mask)
            per = row_change(new, scores.softmax(-1), grad)  # [batch head query_pos]
            effect = per if by_pos else per.sum(-1)
        else:
            new = attention_scores(attn, q, clean, positions, mask)
            if by_pos:
                effect = key_column_change(scores, new, grad).sum(-2)  # [batch head key_pos]
            else:
                effect = row_change(new, scores.softmax(-1), grad).sum(-1)  # [batch head]
            if k.shape[2] != q.shape[2]:  # grouped: a kv head's effect is its query heads' sum
                groups = q.shape[2] // k.shape[2]
                effect = effect.unflatten(1, (k.shape[2], groups)).sum(2)
    # effect: [batch head(, pos)] -> the node axes' order
    head_axis = [a for a in spec.act_axes if a in ("head", "kv_head")][0]
    names = [head_axis] + (["pos"] if by_pos else [])
    if head_axis not in spec.node_axes:
        effect, names = effect.sum(1), names[1:]
    return effect.permute(0, *(1 + names.index(a) for a in spec.node_axes))
