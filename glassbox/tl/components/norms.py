"""TransformerLens's norm classes: ``LayerNorm(cfg, length=None)``, ``LayerNormPre(cfg)``,
``RMSNorm(cfg, length=None)``, ``RMSNormPre(cfg)``, over glassbox's LayerNorm and RMSNorm (the same
computation and hooks: ``hook_scale`` [.. 1], ``hook_normalized`` [.. length] before w and b, plus
glassbox's ``hook_out``).

``cfg`` is a HookedTransformerConfig, a dict of its fields or a glassbox Config; the norm reads its
``eps`` and ``d_model`` (the default ``length``) and is made in ``cfg.dtype``. The "Pre" norms are
TransformerLens's norms without weights (what ``fold_ln`` leaves): built on their own they hold no
parameters (no ``w``, no ``b``) and normalise over the last axis of whatever length they are given.

Inside glassbox.tl's HookedTransformer the norms are glassbox's, given these classes (their state is
glassbox's, so the swap changes nothing computed): ln1, ln2, ln_final and a SoLU MLP's ``mlp.ln`` are
``LayerNormPre`` / ``RMSNormPre`` while ``cfg.normalization_type`` is "LNPre" / "RMSPre" (after
``fold_ln``), and ``LayerNorm`` / ``RMSNorm`` otherwise. Footgun: a folded model's Pre norms still
hold ``w`` = 1 and ``b`` = 0 (glassbox keeps the parameters), where TransformerLens's have none.
"""

from typing import Optional

import torch
from torch import Tensor

from ...hooks import HookPoint
from ...models import Config
from ...models import LayerNorm as _LayerNorm
from ...models import RMSNorm as _RMSNorm
from ...models.norm_hooks import HookedNorm


def _fields(cfg) -> tuple:
    """(eps, d_model, dtype) of a TransformerLens config, a dict of its fields, or a glassbox Config."""
    from ..config.hooked_transformer_config import HookedTransformerConfig

    if isinstance(cfg, Config) and not isinstance(cfg, HookedTransformerConfig):
        return cfg.layer_norm_eps, cfg.d_model, torch.float32
    tl = HookedTransformerConfig.unwrap(cfg)
    values = tl._values
    from ..HookedTransformer import as_dtype

    return float(values["eps"]), int(values["d_model"]), as_dtype(values["dtype"])


def _norm_config(eps: float, d_model: int) -> Config:
    """The smallest glassbox Config carrying what a norm reads (eps, d_model, biases on)."""
    return Config(d_model=d_model, n_layers=1, n_heads=1, d_vocab=1, n_ctx=1, d_mlp=1, layer_norm_eps=eps)


class LayerNorm(_LayerNorm):
    """TransformerLens's ``LayerNorm(cfg, length=None)``: w [length] and b [length], length default d_model."""

    def __init__(self, cfg, length: Optional[int] = None):
        eps, d_model, dtype = _fields(cfg)
        super().__init__(_norm_config(eps, d_model), length)
        self.length = d_model if length is None else length
        self.to(dtype)


class RMSNorm(_RMSNorm):
    """TransformerLens's ``RMSNorm(cfg, length=None)``: w [length], length default d_model."""

    def __init__(self, cfg, length: Optional[int] = None):
        eps, d_model, dtype = _fields(cfg)
        super().__init__(_norm_config(eps, d_model), length)
        self.length = d_model if length is None else length
        self.to(dtype)


class _Weightless:
    """A norm built with no w and b: the affine step is the identity."""

    def _weightless(self, cfg) -> None:
        HookedNorm.__init__(self)
        self.eps, _, self._dtype = _fields(cfg)
        self.offset = 0.0
        self.w = None
        self.b = None
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def affine(self, normalized: Tensor, x: Tensor) -> Tensor:
        if self.w is None:  # built on its own; inside a model w = 1 and b = 0 are kept
            return normalized
        return super().affine(normalized, x)


class LayerNormPre(_Weightless, _LayerNorm):
    """TransformerLens's ``LayerNormPre(cfg)``: (x - mean) / sqrt(var + eps), no weights."""

    def __init__(self, cfg):
        self._weightless(cfg)


class RMSNormPre(_Weightless, _RMSNorm):
    """TransformerLens's ``RMSNormPre(cfg)``: x / sqrt(mean(x^2) + eps), no weights."""

    def __init__(self, cfg):
        self._weightless(cfg)


# The class each of glassbox's norm kinds gets in glassbox.tl's models: (unfolded, folded).
TL_CLASSES = {_LayerNorm: (LayerNorm, LayerNormPre), _RMSNorm: (RMSNorm, RMSNormPre)}
# The norms fold_ln folds (TransformerLens makes these "Pre"); q/k norms and post-norms stay as they are.
FOLDED_NORMS = ("ln1", "ln2", "ln_final", "ln")


def give_tl_classes(model, folded: bool) -> None:
    """Give each glassbox norm of ``model`` TransformerLens's class (see the module docstring)."""
    for name, module in model.named_modules():
        for base, (plain, pre) in TL_CLASSES.items():
            if isinstance(module, base):
                leaf = name.rsplit(".", 1)[-1]
                module.__class__ = pre if folded and leaf in FOLDED_NORMS else plain
                break


__all__ = ["LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre", "give_tl_classes"]
