"""Held-out evaluations of a TranscoderSet on its model, in SAELens's conventions (``interp.sae.evals``).

Tokens whose id is special (``exclude_special_tokens``, as ``evaluate_sae``) are left out of every metric.
Per layer ``l`` (lists, one value per layer), on the model's clean activations:
- ``fvu``: fraction of variance unexplained, ``sum |y - y_hat|^2 / sum |y - mean(y)|^2`` over the kept
  tokens, ``y`` the value at ``feature_output_hook(l)`` and ``y_hat`` the set's estimate from the clean
  inputs (sums in float64);
- ``l0``: mean count of non-zero features per kept token; ``dead_fraction``: share of the layer's
  features that fire on no kept token.
With the replacement spliced in (``compute_ce_loss``): the value at every ``feature_output_hook(l)`` is
replaced by the set's estimate from the inputs of that same run (so a layer reads what the replaced layers
before it wrote), at the kept tokens only (special tokens keep the model's value), and
``ce_loss_with_replacement`` is the mean next-token loss over the targets whose input token is kept;
``ce_loss_without_replacement`` the clean model's, ``ce_loss_with_ablation`` with every output hook's value
zeroed at every position, and ``ce_loss_score`` (CE loss recovered)
``(ablation - replacement) / (ablation - clean)``. Also ``l0_mean``, ``fvu_mean`` and ``dead_fraction_total``.
"""

from typing import Iterable, Union

import torch
from torch import Tensor

from ..sae.evals import check_eval_args, excluded_ids
from .set import TranscoderSet


def _run_inputs_outputs(model, ts: TranscoderSet, batch: Tensor):
    names = [ts.feature_input_hook(l) for l in range(ts.n_layers)] + \
        [ts.feature_output_hook(l) for l in range(ts.n_layers)]
    _, cache = model.run_with_cache(batch, names_filter=names)
    return ({l: cache[ts.feature_input_hook(l)] for l in range(ts.n_layers)},
            {l: cache[ts.feature_output_hook(l)] for l in range(ts.n_layers)})


def replacement_hooks(ts: TranscoderSet, mask: Tensor) -> list:
    """Forward hooks splicing the set in place of the MLPs (module docstring); ``mask`` [batch pos] bool."""
    inputs = {}

    def read(value, hook, layer):
        inputs[layer] = value
        return value

    def write(value, hook, layer):
        if ts.cross_layer:
            given = {s: inputs[s] for s in range(layer + 1)}
        else:
            given = {layer: inputs[layer]}
        est = ts.reconstruct(given)[layer]
        keep = mask.to(value.device)[..., None]
        return torch.where(keep, est.to(value.device, value.dtype), value)

    hooks = []
    for l in range(ts.n_layers):
        hooks.append((ts.feature_input_hook(l), lambda v, hook, l=l: read(v, hook, l)))
        hooks.append((ts.feature_output_hook(l), lambda v, hook, l=l: write(v, hook, l)))
    return hooks


@torch.no_grad()
def evaluate_transcoders(model, ts: TranscoderSet, tokens: Tensor, batch_size: int = 8,
                         exclude_special_tokens: Union[bool, Iterable[int]] = True,
                         compute_ce_loss: bool = True) -> dict:
    """The held-out evals of ``ts`` on ``model`` over the windows ``tokens`` [batch pos] (module docstring)."""
    if not isinstance(ts, TranscoderSet):
        raise TypeError(f"evaluate_transcoders takes a TranscoderSet, got {type(ts).__name__}")
    ts.check_fits(model)
    check_eval_args(tokens, batch_size, compute_ce_loss)
    ignore = torch.tensor(excluded_ids(model, exclude_special_tokens), dtype=torch.long)
    device = next(model.parameters()).device
    n = ts.n_layers
    resid = [0.0] * n
    sum_y, sum_sq = [None] * n, [0.0] * n
    l0, fired, count = [0.0] * n, [torch.zeros(ts.d_transcoder, dtype=torch.long, device=ts.device) for _ in range(n)], 0
    ce = {"clean": [], "replacement": [], "ablation": []}
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start:start + batch_size].to(device)
        mask = ~torch.isin(batch, ignore.to(device))
        keep = mask.reshape(-1).to(ts.device)
        x, y = _run_inputs_outputs(model, ts, batch)
        recon = ts.reconstruct({l: v.to(ts.device) for l, v in x.items()})
        count += int(keep.sum())
        for l in range(n):
            acts = ts.encode(l, x[l].to(ts.device)).reshape(-1, ts.d_transcoder)[keep]
            l0[l] += float((acts != 0).sum())
            fired[l] += (acts != 0).sum(0)
            yl = y[l].to(ts.device).reshape(-1, ts.d_model)[keep].double()
            rl = recon[l].reshape(-1, ts.d_model)[keep].double()
            resid[l] += float((yl - rl).pow(2).sum())
            sum_sq[l] += float(yl.pow(2).sum())
            s = yl.sum(0).cpu()
            sum_y[l] = s if sum_y[l] is None else sum_y[l] + s
        if compute_ce_loss:
            targets = mask[:, :-1]
            _, clean = model(batch, return_type="both", loss_per_token=True)
            _, rep = model.run_with_hooks(batch, return_type="both", loss_per_token=True,
                                          fwd_hooks=replacement_hooks(ts, mask))
            _, abl = model.run_with_hooks(batch, return_type="both", loss_per_token=True,
                                          fwd_hooks=[(ts.feature_output_hook(l), lambda v, hook: torch.zeros_like(v))
                                                     for l in range(n)])
            for name, loss in (("clean", clean), ("replacement", rep), ("ablation", abl)):
                ce[name].append(loss[targets])
    if count == 0:
        raise ValueError("every token of the windows is excluded (special); give windows of text")
    fvu = []
    for l in range(n):
        variance = sum_sq[l] - float(sum_y[l].pow(2).sum()) / count
        fvu.append(resid[l] / variance if variance > 0 else float("nan"))
    dead = [float((f == 0).sum()) / ts.d_transcoder for f in fired]
    result = {"fvu": fvu, "l0": [v / count for v in l0], "dead_fraction": dead, "n_tokens": count,
              "fvu_mean": sum(fvu) / n, "l0_mean": sum(l0) / count / n, "dead_fraction_total": sum(dead) / n}
    if compute_ce_loss:
        means = {name: torch.cat(v).mean().item() for name, v in ce.items()}
        result.update(ce_loss_without_replacement=means["clean"], ce_loss_with_replacement=means["replacement"],
                      ce_loss_with_ablation=means["ablation"],
                      ce_loss_score=(means["ablation"] - means["replacement"]) / (means["ablation"] - means["clean"]),
                      n_ce_tokens=sum(len(v) for v in ce["clean"]))
    return result
