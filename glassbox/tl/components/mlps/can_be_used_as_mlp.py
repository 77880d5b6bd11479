"""TransformerLens's ``CanBeUsedAsMLP``: the base of every MLP module, ``CanBeUsedAsMLP(cfg)``.

Constructed from a dict of HookedTransformerConfig fields or a HookedTransformerConfig: ``cfg``, ``d_mlp``
(a ``ValueError`` when the config has none); ``select_activation_function()`` sets ``act_fn`` to the
function TransformerLens's name picks (``glassbox.tl.utils.ACTIVATION_FN_DICT``, a ``ValueError`` naming
an unknown one) and, for a LayerNorm activation ("solu_ln"), ``hook_mid`` and ``ln`` (a ``LayerNorm`` of
d_mlp, or ``LayerNormPre`` for a normalization_type other than "LN"). Its forward returns its input.

glassbox's own MLP and GatedMLP are registered as subclasses, so ``isinstance(block.mlp, CanBeUsedAsMLP)``
holds for a glassbox model's MLPs; glassbox.tl's ``MLP`` and ``GatedMLP`` subclass it.
"""

import abc

from torch import Tensor, nn

from ....hooks import HookPoint
from ....models import GatedMLP as _GlassboxGatedMLP
from ....models import MLP as _GlassboxMLP
from .._standalone import standalone_config


class _MLPMeta(abc.ABCMeta):
    """isinstance of glassbox.tl's MLP (GatedMLP) holds for glassbox's MLP (GatedMLP) modules too."""

    def __instancecheck__(cls, instance) -> bool:
        if super().__instancecheck__(instance):
            return True
        glassbox_class = cls.__dict__.get("_glassbox_class")
        return glassbox_class is not None and isinstance(instance, glassbox_class)


class CanBeUsedAsMLP(nn.Module, metaclass=_MLPMeta):
    def __init__(self, cfg):
        super().__init__()
        self.cfg, _ = standalone_config(cfg, type(self).__name__)
        if self.cfg.d_mlp is None:
            raise ValueError(f"{type(self).__name__}: cfg.d_mlp must be set to use an MLP")
        self.d_mlp = self.cfg.d_mlp

    def forward(self, x: Tensor) -> Tensor:
        return x

    def select_activation_function(self) -> None:
        from ..._activation_functions import ACTIVATION_FN_DICT

        name = self.cfg.act_fn
        if name not in ACTIVATION_FN_DICT:
            raise ValueError(f"cfg.act_fn={name!r} is not one of TransformerLens's activations "
                             f"({', '.join(ACTIVATION_FN_DICT)})")
        self.act_fn = ACTIVATION_FN_DICT[name]
        if self.cfg.is_layer_norm_activation():
            from .. import LayerNorm, LayerNormPre

            self.hook_mid = HookPoint()
            self.ln = LayerNorm(self.cfg, self.d_mlp) if self.cfg.normalization_type == "LN" else LayerNormPre(self.cfg)


CanBeUsedAsMLP.register(_GlassboxMLP)
CanBeUsedAsMLP.register(_GlassboxGatedMLP)
