"""SAE evaluations, computed as SAELens's ``sae_lens.evals`` computes them (``run_evals`` with
``compute_ce_loss``, ``compute_kl``, ``compute_sparsity_metrics``, ``compute_variance_metrics`` and
``compute_featurewise_density_statistics``), on given token windows.

Tokens: every token whose id is special (``exclude_special_tokens=True``: the tokenizer's BOS, EOS,
PAD, SEP and decoder-start ids, as SAELens's ``get_special_token_ids``; or a list of ids; or False)
is left out of every metric, as SAELens does:
- ``l0`` / ``l1``: the mean, over the kept tokens, of the number of non-zero features (``!= 0``) /
  the sum of their absolute values;
- ``mse``: the mean over the kept tokens of ``|x - x_hat|^2`` (summed over the width);
- ``explained_variance``: ``1 - mse / Var(x)``, ``Var(x) = E|x|^2 - |E x|^2`` over all kept tokens
  (sums kept in float64), 1.0 when ``Var(x) < 1e-10`` and ``mse < 1e-10``, else 0.0 then
  (SAELens's ``ExplainedVarianceCalculator``);
- ``ce_loss_without_sae`` / ``_with_sae`` / ``_with_ablation``: the mean next-token loss, over the
  targets whose INPUT token is kept (the loss predicting token t+1 from a BOS at t is left out), of
  the clean model, of the model with the SAE's reconstruction written at the hook (error term off)
  at the kept tokens only (special tokens keep their clean activation, as SAELens's replacement
  hook), and with the hook's activation zeroed at every position (SAELens's ablation baseline);
- ``ce_loss_score`` (CE loss recovered): ``(ce_with_ablation - ce_with_sae) / (ce_with_ablation - ce_without_sae)``;
- ``kl_div_with_sae`` / ``_with_ablation``: the mean of KL(clean || spliced) of the next-token
  distributions at the kept tokens (every position, the last one too), and
  ``kl_div_score = (kl_with_ablation - kl_with_sae) / kl_with_ablation``;
- ``dead_fraction``: the share of features that fire (``!= 0``) on none of the kept tokens (SAELens's
  ``feature_density`` is 0 for them); ``feature_density`` (with ``feature_density=True``): each
  feature's firing frequency over the kept tokens.
Each SAELens mean is over the metric values of every token of every batch at once, so batch sizes
do not change the result (beyond float rounding). A transcoder is refused (these metrics compare a
reconstruction with the value it replaced).
"""

from typing import Iterable, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import SAE
from .checks import check_finite_state, check_one_head

SPECIAL_TOKEN_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")


def excluded_ids(model, exclude_special_tokens: Union[bool, Iterable[int]]) -> list:
    """The token ids left out of the metrics (module docstring)."""
    if exclude_special_tokens is False:
        return []
    if exclude_special_tokens is True:
        try:
            tokenizer = model.tokenizer
        except ValueError:
            raise ValueError("exclude_special_tokens=True needs the model's tokenizer, and this model has none; "
                             "pass the ids to exclude (e.g. [bos_id]) or False") from None
        return sorted({getattr(tokenizer, a, None) for a in SPECIAL_TOKEN_ATTRS} - {None})
    ids = list(exclude_special_tokens)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"exclude_special_tokens must be True, False or a list of token ids, got {ids!r}")
    return sorted(set(ids))


def check_eval_args(tokens, batch_size, compute_ce_loss: bool) -> None:
    """Refuse held-out windows that are not an integer [batch pos] tensor (of >= 2 tokens for the CE loss)
    and a batch size that is not a whole number >= 1."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise ValueError(f"tokens must be an integer tensor [batch pos], got "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    if compute_ce_loss and tokens.shape[1] < 2:
        raise ValueError("the CE loss needs windows of at least 2 tokens")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")


def stop_layer(hook_name: str, n_layers: int):
    parts = hook_name.split(".")
    if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit():
        return min(int(parts[1]) + 1, n_layers)
    return None


class _Totals:
    """Per-token metric values and the explained-variance sums, over every batch."""

    def __init__(self, d_sae: int, device):
        self.l0, self.l1, self.mse, self.ce, self.kl = [], [], [], {"clean": [], "sae": [], "ablation": []}, \
            {"sae": [], "ablation": []}
        self.sum_x, self.sum_sq, self.sum_resid, self.n = None, 0.0, 0.0, 0
        self.fired = torch.zeros(d_sae, dtype=torch.long, device=device)

    def add_variance(self, x: Tensor, x_hat: Tensor) -> None:
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        batch_sum = x.sum(0).to("cpu", torch.float64)
        self.sum_x = batch_sum if self.sum_x is None else self.sum_x + batch_sum
        self.sum_sq += x.pow(2).sum().item()
        self.sum_resid += (x - x_hat).pow(2).sum().item()
        self.n += x.shape[0]

    def explained_variance(self) -> float:
        if self.n == 0:
            return 0.0
        variance = self.sum_sq / self.n - (self.sum_x / self.n).pow(2).sum().item()
        mse = self.sum_resid / self.n
        if variance < 1e-10:
            return 1.0 if mse < 1e-10 else 0.0
        return 1.0 - mse / variance


def _mean(values: list) -> float:
    return torch.cat(values).mean().item()


@torch.no_grad()
def evaluate_sae(model, sae: SAE, tokens: Tensor, batch_size: int = 8,
                 exclude_special_tokens: Union[bool, Iterable[int]] = True, compute_ce_loss: bool = True,
                 feature_density: bool = False) -> dict:
    """SAELens's evals of ``sae`` on ``model`` over the windows ``tokens`` (module docstring).

    ``tokens`` [batch pos] (int) are run as given (no BOS is added: give windows that start with one, as the SAE was
    trained on). Returns floats: l0, l1, mse, explained_variance, dead_fraction, n_dead, n_tokens
    (kept tokens) and, with ``compute_ce_loss``, ce_loss_score, ce_loss_with_sae,
    ce_loss_without_sae, ce_loss_with_ablation, kl_div_score, kl_div_with_sae, kl_div_with_ablation,
    n_ce_tokens; ``feature_density`` adds the per-feature list.
    """
    if not isinstance(sae, SAE):
        raise TypeError(f"evaluate_sae takes a glassbox SAE, got {type(sae).__name__}")
    check_finite_state(sae, f"evaluate_sae: the SAE at {sae.cfg.hook_name}")
    check_one_head(sae, "evaluate_sae")
    if sae.cfg.is_transcoder:
        raise ValueError(f"the SAE reads at {sae.cfg.hook_name} and writes at {sae.cfg.hook_out}: a transcoder; "
                         "evaluate_sae evaluates SAEs that reconstruct the value they read")
    hook = sae.cfg.hook_name
    if hook not in model.hook_dict:
        raise KeyError(f"the SAE reads at {hook!r}, which this model does not have")
    check_eval_args(tokens, batch_size, compute_ce_loss)
    ignore = torch.tensor(excluded_ids(model, exclude_special_tokens), dtype=torch.long)
    device = next(model.parameters()).device
    totals = _Totals(sae.cfg.d_sae, sae.device)
    was_training = sae.training
    sae.eval()
    try:
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start:start + batch_size].to(device)
            mask = ~torch.isin(batch, ignore.to(device))
            _sparsity_and_variance(model, sae, batch, mask, totals)
            if compute_ce_loss:
                _recons_losses(model, sae, batch, mask, totals)
    finally:
        sae.train(was_training)
    n_tokens = sum(len(v) for v in totals.l0)
    if n_tokens == 0:
        raise ValueError("every token of the windows is excluded (special); give windows of text")
    n_dead = int((totals.fired == 0).sum())
    result = {"l0": _mean(totals.l0), "l1": _mean(totals.l1), "mse": _mean(totals.mse),
              "explained_variance": totals.explained_variance(), "dead_fraction": n_dead / sae.cfg.d_sae,
              "n_dead": n_dead, "n_tokens": n_tokens}
    if compute_ce_loss:
        ce = {name: _mean(values) for name, values in totals.ce.items()}
        kl = {name: _mean(values) for name, values in totals.kl.items()}
        result.update(ce_loss_score=(ce["ablation"] - ce["sae"]) / (ce["ablation"] - ce["clean"]),
                      ce_loss_with_sae=ce["sae"], ce_loss_without_sae=ce["clean"], ce_loss_with_ablation=ce["ablation"],
                      kl_div_score=(kl["ablation"] - kl["sae"]) / kl["ablation"], kl_div_with_sae=kl["sae"],
                      kl_div_with_ablation=kl["ablation"], n_ce_tokens=sum(len(v) for v in totals.ce["clean"]))
    if feature_density:
        result["feature_density"] = (totals.fired.double() / n_tokens).tolist()
    return result


def _sparsity_and_variance(model, sae: SAE, batch: Tensor, mask: Tensor, totals: _Totals) -> None:
    hook = sae.cfg.hook_name
    _, cache = model.run_with_cache(batch, names_filter=hook, stop_at_layer=stop_layer(hook, model.cfg.n_layers))
    acts = cache[hook]
    feature_acts = sae.encode(acts.to(sae.device))
    x_hat = sae.decode(feature_acts).flatten(2)  # a hook_z SAE's [batch pos head d_head], flattened
    x = acts.flatten(2).to(sae.device)
    keep = mask.reshape(-1).to(sae.device)
    # In the wider of the two dtypes, as SAELens (which lets torch promote a half model's activations).
    wide = torch.promote_types(x.dtype, x_hat.dtype)
    x, x_hat = x.reshape(-1, x.shape[-1])[keep].to(wide), x_hat.reshape(-1, x_hat.shape[-1])[keep].to(wide)
    flat_acts = feature_acts.reshape(-1, feature_acts.shape[-1])[keep]
    firing = flat_acts != 0
    totals.l0.append(firing.sum(-1).float())
    totals.l1.append(flat_acts.abs().sum(-1))
    totals.mse.append((x - x_hat).pow(2).sum(-1))
    totals.add_variance(x, x_hat)
    totals.fired += firing.sum(0)


def _recons_losses(model, sae: SAE, batch: Tensor, mask: Tensor, totals: _Totals) -> None:
    hook = sae.cfg.hook_name

    def splice(value: Tensor, hook=None) -> Tensor:
        recons = sae.decode(sae.encode(value.to(sae.device))).reshape(value.shape).to(value.dtype)
        where = mask.to(value.device).reshape(mask.shape + (1,) * (value.ndim - 2))
        return torch.where(where, recons.to(value.device), value)

    def ablate(value: Tensor, hook=None) -> Tensor:
        return torch.zeros_like(value)

    clean_logits, clean_loss = model(batch, return_type="both", loss_per_token=True)
    sae_logits, sae_loss = model.run_with_hooks(batch, return_type="both", loss_per_token=True,
                                                fwd_hooks=[(hook, splice)])
    abl_logits, abl_loss = model.run_with_hooks(batch, return_type="both", loss_per_token=True,
                                                fwd_hooks=[(hook, ablate)])
    keep = mask[:, :-1]
    clean_probs = F.softmax(clean_logits, dim=-1)
    for name, loss in (("clean", clean_loss), ("sae", sae_loss), ("ablation", abl_loss)):
        totals.ce[name].append(loss[keep])
    for name, logits in (("sae", sae_logits), ("ablation", abl_logits)):
        kl = F.kl_div(F.log_softmax(logits, dim=-1), clean_probs, reduction="none").sum(-1)
        totals.kl[name].append(kl[mask])  # every position's KL, the last one's too (SAELens)
