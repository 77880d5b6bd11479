"""The SAE training losses, SAELens's (``TrainingSAE.training_forward_pass`` and its subclasses).

For a batch ``x`` [tokens d_in] of raw activations:
- reconstruction ``mse_loss = ((x_hat - x) ** 2).sum(-1).mean()`` (summed over the width, averaged
  over tokens, as SAELens);
- ``"topk"``: SAELens's TopK training SAE with ``rescale_acts_by_decoder_norm=True``: the
  pre-activations are multiplied by the decoder row norms before the top k are kept (ReLU applied
  to them), and the decoder divides them out again, ``x_hat = (acts / |W_dec|) @ W_dec + b_dec``:
  the SAE trains as if every decoder row had norm 1, whatever norm it drifts to, so the top-k choice
  does not depend on the drift. ``fold_decoder_norms`` makes it an ordinary TopK SAE with unit
  decoder rows (the saved form). Dead features get the AuxK loss: the top ``k_aux = d_in // 2`` dead
  features (by pre-activation; fewer when fewer are dead) reconstruct the detached residual
  ``x - x_hat`` without ``b_dec``, ``aux = coef * min(n_dead / k_aux, 1) * ((r_hat - r) ** 2).sum(-1).mean()``;
- ``"standard"``: ReLU, with SAELens's L1 penalty weighted by the decoder norms,
  ``l1_loss = coef * (acts * |W_dec|).sum(-1).mean()``; the decoder is not constrained (the
  weighting makes shrinking the decoder useless), and ``fold_decoder_norms`` gives unit rows at the end.
The hook points after ``hook_sae_acts_pre`` do not fire during training.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from ...interp.sae.base import SAE


def topk_relu(hidden_pre: Float[Tensor, "tokens d_sae"], k: int) -> Float[Tensor, "tokens d_sae"]:
    """The k largest values of each row, through ReLU; zeros elsewhere."""
    values, indices = torch.topk(hidden_pre, k=k, dim=-1, sorted=False)
    return torch.zeros_like(hidden_pre).scatter_(-1, indices, values.relu())


def aux_k_acts(hidden_pre: Float[Tensor, "tokens d_sae"], dead: Tensor, k_aux: int) -> Float[Tensor, "tokens d_sae"]:
    """The ``k_aux`` largest pre-activations among the dead features of each row; zeros elsewhere."""
    masked = torch.where(dead[None], hidden_pre, torch.full_like(hidden_pre, float("-inf")))
    values, indices = masked.topk(k_aux, dim=-1, sorted=False)
    return torch.zeros_like(hidden_pre).scatter_(-1, indices, values)


def training_step_losses(sae: SAE, x: Float[Tensor, "tokens d_in"], dead: Tensor, l1_coefficient: float,
                         aux_coefficient: float) -> dict:
    """Losses of one batch: ``loss`` (their sum, to backpropagate), ``mse_loss``, ``l1_loss`` or
    ``aux_loss``, and ``feature_acts`` / ``sae_out`` for the step's statistics. ``dead`` [d_sae] bool."""
    # The stream's rows are flattened; a hook_z SAE's encode takes the heads unflattened (as SAELens's).
    hidden_pre = sae.encode_pre(x.unflatten(-1, (-1, sae.d_head)) if sae.cfg.reshape_activations == "hook_z" else x)
    out = {}
    if sae.cfg.architecture == "topk":
        norms = sae.W_dec.norm(dim=-1)
        hidden_pre = hidden_pre * norms
        acts = topk_relu(hidden_pre, sae.cfg.k)
        sae_out = (acts / norms) @ sae.W_dec + sae.b_dec
        n_dead = int(dead.sum())
        if n_dead == 0:
            aux = sae_out.new_zeros(())
        else:
            k_aux = x.shape[-1] // 2
            scale = min(n_dead / k_aux, 1.0)
            residual = (x - sae_out).detach()
            aux_acts = aux_k_acts(hidden_pre, dead, min(k_aux, n_dead))
            aux = aux_coefficient * scale * ((aux_acts / norms) @ sae.W_dec - residual).pow(2).sum(-1).mean()
        out["aux_loss"] = aux
    elif sae.cfg.architecture == "standard":
        acts = torch.relu(hidden_pre)
        sae_out = acts @ sae.W_dec + sae.b_dec
        out["l1_loss"] = l1_coefficient * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()
    else:
        raise ValueError(f"training supports the 'topk' and 'standard' architectures, not "
                         f"{sae.cfg.architecture!r}")
    mse = (sae_out - x).pow(2).sum(-1).mean()
    penalty = out.get("aux_loss", out.get("l1_loss"))
    return {"loss": mse + penalty, "mse_loss": mse, **out, "feature_acts": acts, "sae_out": sae_out}


@torch.no_grad()
def batch_metrics(x: Float[Tensor, "tokens d_in"], sae_out: Float[Tensor, "tokens d_in"],
                  feature_acts: Float[Tensor, "tokens d_sae"]) -> dict:
    """L0 and explained variance of one training batch, as SAELens logs them while training:
    ``l0`` the mean count of non-zero features per token, ``explained_variance``
    ``1 - mean|x - x_hat|^2 / mean|x - mean(x)|^2`` over the batch's tokens."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    residual = (sae_out - x).pow(2).sum(-1)
    variance = (x - x.mean(0)).pow(2).sum(-1)
    return {"l0": (feature_acts != 0).sum(-1).float().mean().item(),
            "explained_variance": (1 - residual.mean() / variance.mean()).item()}


@torch.no_grad()
def fold_decoder_norms(sae: SAE) -> None:
    """Give every decoder row norm 1, scaling its encoder column and bias by the norm: a TopK SAE
    trained with decoder-norm rescaling becomes an ordinary one with the same ``decode(encode(x))``
    (up to rounding); for ReLU the same holds because ReLU commutes with a positive scale."""
    norms = sae.W_dec.norm(dim=-1)
    sae.W_enc.mul_(norms[None, :])
    sae.b_enc.mul_(norms)
    sae.W_dec.div_(norms[:, None])
