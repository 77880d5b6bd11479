"""Features in the analysis tools: feature activations from a cache, the decomposition of a hook's value
into features + error + decoder bias, direct logit attribution of features, top features per position.

Every function takes an ``ActivationCache`` (or a mapping with ``.model``, for the logit attribution)
and a glassbox SAE; the cache may come from a run with the SAE spliced (``model.saes([sae])``) or from
the clean model.

Contract:
- ``feature_acts(cache, sae)`` [batch pos d_sae] is the cache's ``<hook>.hook_sae_acts_post`` when
  the run had the SAE spliced (what the run saw, after any hook there), else ``sae.encode`` of the
  cached value at ``sae.cfg.hook_name`` (the model's value there: a splice's hooks fire on it before
  the SAE runs, so the two agree on a run whose hooks replace nothing). The SAE's own hook points do
  not fire when it is encoded here.
- ``decompose(cache, sae)``: the value the SAE reconstructs, ``cache[hook]`` at ``sae.cfg.hook_out``
  (the MLP output for a transcoder), is exactly ``sum_f acts[f] * d[f] + b_dec (+ skip) + error``
  with ``error = value - (acts @ d + b_dec) (- skip)``, ``d = sae.decoder_directions()`` (``W_dec``; its
  rows over their norms for a TopK SAE with ``rescale_acts_by_decoder_norm``), ``skip`` a skip transcoder's
  ``x @ W_skip.T`` of its input (None for others): the parts sum to the value to float rounding. A hook_z
  SAE's parts are in its flattened ``(head d_head)`` space; ``Decomposition.value`` is flattened too.
- ``feature_logit_attrs``: feature f's direct share of the logit of ``tokens`` at each position, the
  way ``logit_attrs`` attributes a residual-stream component: the feature's output in the residual
  stream (``d[f]``; through ``W_O`` for a hook_z SAE, ``W_out`` for one at ``mlp.hook_post``),
  centred (LayerNorm), divided by the final norm's *cached* scale, times its weight, dotted with
  ``W_U[:, token]``; times the feature's activation. The sum over features plus the same of the error
  and of b_dec (and of a skip transcoder's skip term) is that hook's direct logit attribution.

Footguns: the direct path of an SAE at ``resid_pre`` (``resid_mid``) of layer L carries the feature's
decoder vector unchanged to the final norm, ignoring what the later layers do with it: a logit lens of
the feature, not its total effect (patch it for that, ``feature_patching.py``). A model that soft-caps
its logits has no exact linear share of them, and a post-norm or sandwich-norm block's outputs are
normalised again before the stream: both are refused. So are SAEs that normalise their input
(``normalize_activations`` other than "none"): their output is un-normalised position by position, so a
feature's contribution is not ``acts[f] * d[f]``.
"""

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..resid import norm_at
from ..sublayer_norm import norm_weight
from .base import SAE
from .splice import hooks_off

RESID_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")


def acts_name(sae: SAE) -> str:
    """Where a spliced SAE's feature activations are cached: ``<hook it writes at>.hook_sae_acts_post``."""
    return f"{sae.cfg.hook_out}.hook_sae_acts_post"


def check_sae(sae) -> None:
    if not isinstance(sae, SAE):
        raise TypeError(f"expected a glassbox SAE, got {type(sae).__name__}")


def check_linear(sae: SAE) -> None:
    """Refuse an SAE whose output is not ``acts @ decoder_directions() + b_dec`` (a normalising one)."""
    check_sae(sae)
    if sae.cfg.normalize_activations != "none":
        raise ValueError(f"the SAE at {sae.cfg.hook_name} normalises its input "
                         f"(normalize_activations={sae.cfg.normalize_activations!r}) and un-normalises its output "
                         "per position, so a feature's contribution is not acts[f] * W_dec[f]; refused")


def cached(cache, name: str, why: str) -> Tensor:
    if name not in cache:
        raise KeyError(f"the cache has no {name!r}, which {why}; cache it in the run (names_filter)")
    return cache[name]


def feature_acts(cache, sae: SAE) -> Float[Tensor, "batch pos d_sae"]:
    """Feature activations [batch pos d_sae] of the run in ``cache`` (see the module docstring)."""
    check_sae(sae)
    name = acts_name(sae)
    if name in cache:
        return cache[name]
    x = cached(cache, sae.cfg.hook_name, "the SAE reads (or cache its hook_sae_acts_post with it spliced)")
    with hooks_off(list(sae.hook_dict.values())):
        return sae.encode(x.to(sae.device))


@dataclass
class Decomposition:
    """``value == contributions().sum(0) + b_dec (+ skip) + error`` to float rounding (d_out is the width
    the SAE writes: its d_in, or a transcoder's d_out)."""

    acts: Float[Tensor, "batch pos d_sae"]
    W_dec: Float[Tensor, "d_sae d_out"]
    b_dec: Float[Tensor, "d_out"]
    error: Float[Tensor, "batch pos d_out"]
    value: Float[Tensor, "batch pos d_out"]
    skip: Optional[Tensor] = None  # [batch pos d_out], a skip transcoder's x @ W_skip.T

    def contributions(self, features: Optional[Sequence[int]] = None) -> Float[Tensor, "feature batch pos d_out"]:
        """``acts[..., f] * W_dec[f]`` (the decoder directions) for each feature (all by default: d_sae x batch x pos x d_out values)."""
        index = torch.arange(self.W_dec.shape[0], device=self.W_dec.device) if features is None else \
            torch.as_tensor(features, device=self.W_dec.device, dtype=torch.long)
        return torch.einsum("bpf,fd->fbpd", self.acts[..., index], self.W_dec[index])

    def reconstruction(self) -> Float[Tensor, "batch pos d_out"]:
        """What the splice writes without the error term: features, b_dec and any skip term."""
        out = self.acts @ self.W_dec + self.b_dec
        return out if self.skip is None else out + self.skip


def decompose(cache, sae: SAE) -> Decomposition:
    """The value at ``sae.cfg.hook_out`` as features + decoder bias + error (module docstring)."""
    check_linear(sae)
    acts = feature_acts(cache, sae)
    value = cached(cache, sae.cfg.hook_out, "the SAE writes at").to(sae.device)
    flat = value.flatten(-2) if sae.cfg.reshape_activations == "hook_z" else value
    flat = flat.to(sae.dtype)
    W_dec, b_dec = sae.decoder_directions().detach(), sae.b_dec.detach()
    skip = None
    if getattr(sae, "W_skip", None) is not None:
        x = cached(cache, sae.cfg.hook_name, "the skip transcoder reads").to(sae.device)
        skip = sae.skip(x).detach()
    parts = Decomposition(acts, W_dec, b_dec, flat, flat, skip)
    parts.error = flat - parts.reconstruction()
    return parts


def residual_directions(model, sae: SAE) -> Float[Tensor, "d_sae d_model"]:
    """Each feature's output written into the residual stream per unit of activation: its decoder
    direction (``sae.decoder_directions()``), or that through W_O / W_out."""
    check_linear(sae)
    cfg = model.cfg
    out = sae.cfg.hook_out
    parts = out.split(".")
    W_dec = sae.decoder_directions().detach()
    if out in ("hook_embed", "hook_pos_embed") or (len(parts) == 3 and parts[0] == "blocks" and parts[2] in RESID_HOOKS):
        if cfg.norm_placement == "post":
            raise ValueError(f"post-norm blocks normalise the stream after each sublayer: {out} has no linear "
                             "path to the logits")
        return W_dec
    if len(parts) == 4 and parts[0] == "blocks" and parts[2:] in (["attn", "hook_z"], ["mlp", "hook_post"]):
        if cfg.norm_placement != "pre":
            raise ValueError(f"norm_placement={cfg.norm_placement!r}: the sublayer's output is normalised again "
                             f"before the residual stream, so {out} has no linear path to the logits")
        block = model.blocks[int(parts[1])]
        if parts[2] == "attn":
            if sae.cfg.reshape_activations != "hook_z":
                raise ValueError(f"an SAE at {out} without reshape_activations='hook_z' reads one head's "
                                 "d_head values, not the attention output: no direct path to attribute")
            W_O = block.attn.W_O.detach()  # [head d_head d_model]
            return W_dec @ W_O.reshape(-1, W_O.shape[-1]).to(W_dec.dtype)
        return W_dec @ block.mlp.W_out.detach().to(W_dec.dtype)
    raise ValueError(f"no direct path to the logits is defined for an SAE writing at {out!r}: features are "
                     f"attributed at {', '.join(RESID_HOOKS)}, attn.hook_z (flattened) and mlp.hook_post")


def token_grid(model, tokens, shape: tuple, device) -> Int[Tensor, "batch pos"]:
    if isinstance(tokens, str):
        tokens = model.to_single_token(tokens)
    ids = torch.as_tensor(tokens, device=device)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
        raise ValueError(f"tokens must be token ids, got dtype {ids.dtype}")
    given = tuple(ids.shape)
    if ids.ndim == 1:
        ids = ids[:, None]
    if ids.ndim > 2 or any(s not in (1, t) for s, t in zip(ids.shape, shape)):
        raise ValueError(f"tokens of shape {given} do not fit the cache's [batch pos] = {shape}: give "
                         "one id, one per prompt [batch], or one per position [batch pos]")
    bad = ids[(ids < 0) | (ids >= model.cfg.d_vocab)]
    if bad.numel():
        raise ValueError(f"token id {int(bad.flatten()[0])} is outside [0, d_vocab={model.cfg.d_vocab})")
    return ids.long().expand(shape)


def feature_logit_attrs(cache, sae: SAE, tokens: Union[int, str, Tensor], incorrect_tokens=None,
                        features: Optional[Sequence[int]] = None) -> Float[Tensor, "batch pos feature"]:
    """Direct logit attribution of each feature [batch pos feature] (module docstring).

    ``tokens``: one id (or single-token string), one per prompt [batch] or one per position [batch pos];
    the logit read at every position. ``incorrect_tokens`` (same forms): attribute the difference.
    ``features``: the feature ids to attribute (default all), in the result's order.
    """
    check_sae(sae)
    model = cache.model
    cap = getattr(model.cfg, "output_logits_soft_cap", None)
    if cap is not None:
        raise ValueError(f"the model soft-caps its logits (output_logits_soft_cap={cap}): features have no exact "
                         "linear share of them")
    if not cache.has_batch_dim:
        raise ValueError("feature_logit_attrs reads a cache with its batch axis (not remove_batch_dim)")
    acts = feature_acts(cache, sae)
    if features is not None:
        acts = acts[..., torch.as_tensor(features, device=acts.device, dtype=torch.long)]
    directions = residual_directions(model, sae)
    if features is not None:
        directions = directions[torch.as_tensor(features, device=directions.device, dtype=torch.long)]
    norm, scale_name = norm_at(cache, None)
    scale = cached(cache, scale_name, "divides the final residual stream").to(acts.device, acts.dtype)
    if model.cfg.normalization == "LN":
        directions = directions - directions.mean(-1, keepdim=True)
    directions = directions * norm_weight(norm, directions)
    W_U = model.W_U.detach().to(directions.device, directions.dtype)
    ids = token_grid(model, tokens, tuple(acts.shape[:2]), acts.device)

    def logit_dirs(ids: Tensor) -> Tensor:  # [batch pos feature]: each feature's logit per unit activation
        return torch.einsum("fd,dbp->bpf", directions, W_U[:, ids])

    per_unit = logit_dirs(ids)
    if incorrect_tokens is not None:
        per_unit = per_unit - logit_dirs(token_grid(model, incorrect_tokens, tuple(acts.shape[:2]), acts.device))
    return acts * per_unit / scale


def top_features(acts_or_cache, sae: Optional[SAE] = None, k: int = 10) -> tuple:
    """The ``k`` most active features at each position: ``(values, indices)``, each [batch pos k], largest
    first. Takes feature activations [batch pos d_sae], or a cache and the SAE."""
    acts = acts_or_cache if isinstance(acts_or_cache, Tensor) else feature_acts(acts_or_cache, sae)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= acts.shape[-1]:
        raise ValueError(f"k must be an int in [1, d_sae={acts.shape[-1]}], got {k!r}")
    out = torch.topk(acts, k, dim=-1, largest=True, sorted=True)
    return out.values, out.indices
