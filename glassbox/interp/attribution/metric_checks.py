"""The checks every gradient method (AtP, AtP*, EAP, EAP-IG) makes of its metric, so that a metric it
cannot differentiate is refused by name instead of giving NaN scores, zero scores or autograd's message.

- ``check_values``: what the metric returned is a floating-point tensor (TypeError for a Python
  number, an int, bool or complex tensor) whose every value is finite (ValueError naming the first
  prompt with NaN or inf, and the run: "on the corrupted run", "at t = 0.4", ...); with
  ``need_grad`` (or ``check_has_grad``) it must carry a gradient (a detached tensor is refused).
- ``check_reads_logits``: the objective depends on the logits (a tensor that needs grad but is not
  computed from them, e.g. a constant with requires_grad=True, would give every score 0).
- ``check_scores``: the scores are finite where they exist (a finite metric whose gradient is NaN or
  inf, e.g. sqrt at 0, or a float16 overflow, is refused naming the first bad node or edge).

Shapes stay the caller's check (AtP takes one value per prompt or a VariantMetric's scalar; EAP one
value per batch row). Names in messages: the metric's ``name``, else its ``__name__``, else its type.
"""

from typing import Optional

import torch
from torch import Tensor


def metric_name(metric) -> str:
    return str(getattr(metric, "name", None) or getattr(metric, "__name__", None) or type(metric).__name__)


def check_values(metric, values, where: str, need_grad: bool, n_prompts: Optional[int] = None,
                 row_label=None) -> None:
    """Refuse a non-tensor, a non-floating tensor, non-finite values and (``need_grad``) a tensor that
    carries no gradient. ``row_label(i)`` names row i in messages (default "prompt i")."""
    name = metric_name(metric)
    if not isinstance(values, Tensor):
        raise TypeError(f"the metric {name} returned a {type(values).__name__} {where}, not a tensor: return a "
                        "floating-point tensor computed from the logits with torch operations, so that it has a "
                        "gradient")
    if not values.dtype.is_floating_point:
        raise TypeError(f"the metric {name} returned {str(values.dtype).replace('torch.', '')} values {where}: a "
                        "gradient method needs floating-point values computed from the logits (an integer, bool or "
                        "complex value has no gradient to attribute)")
    finite = torch.isfinite(values.detach())
    if not bool(finite.all()):
        flat = values.detach().reshape(-1)
        i = int((~finite.reshape(-1)).nonzero()[0])
        label = row_label(i) if row_label is not None else f"prompt {i}" if values.ndim == 1 else f"element {i}"
        raise ValueError(f"the metric {name} is {float(flat[i])} {where} (at {label}; "
                         f"{int((~finite).sum())} of {values.numel()} values are not finite): scores computed from it "
                         "would be NaN; fix the metric or the prompts")
    if need_grad:
        check_has_grad(metric, values, where)


def check_has_grad(metric, values: Tensor, where: str) -> None:
    """Refuse metric values that carry no gradient."""
    name = metric_name(metric)
    if not values.requires_grad:
        raise ValueError(f"the metric {name} returned a tensor with no gradient {where} (detached, or computed under "
                         "torch.no_grad / from .item() values): a gradient method differentiates the metric in the "
                         "logits, so compute it from them with torch operations")


def check_reads_logits(metric, objective: Tensor, logits: Tensor, where: str) -> None:
    """Refuse an objective that needs grad but does not depend on ``logits`` (autograd reaches them not)."""
    (grad,) = torch.autograd.grad(objective, logits, retain_graph=True, allow_unused=True)
    if grad is None:
        raise ValueError(f"the metric {metric_name(metric)} does not depend on the logits {where} (no gradient "
                         "reaches them): every score would be 0; compute the metric from the logits it is given")


def check_scores(metric, scores: Tensor, exists: Optional[Tensor], label) -> None:
    """Refuse non-finite scores (where ``exists``, if given); ``label(flat index)`` names the node or edge."""
    bad = ~torch.isfinite(scores)
    if exists is not None:
        bad &= exists
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(f"the gradient of the metric {metric_name(metric)} is not finite: the score of {label(i)} is "
                         f"{float(scores.reshape(-1)[i])} ({int(bad.sum())} scores are NaN or inf) while the metric "
                         "itself and the activations are finite (a metric whose derivative is infinite where it is "
                         "evaluated, e.g. sqrt at 0, or an overflow in a narrow dtype)")
