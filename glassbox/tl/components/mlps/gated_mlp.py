"""TransformerLens's ``GatedMLP``: ``GatedMLP(cfg)`` built on its own, computing with glassbox's
``GatedMLP`` (its base) in TransformerLens's bias placement (``Config.gated_mlp_bias="product"``):

    hook_pre = x @ W_gate,  hook_pre_linear = x @ W_in,  hook_post = act(hook_pre) * hook_pre_linear + b_in,
    out = hook_post @ W_out + b_out

Parameters W_gate, W_in [d_model d_mlp], W_out [d_mlp d_model], b_in [d_mlp], b_out [d_model] (no
b_gate) in ``cfg.dtype``, uninitialised until loaded; ``act_fn`` the activation.
"""

from ....models import GatedMLP as _GlassboxGatedMLP
from .._standalone import finish, standalone_config
from .can_be_used_as_mlp import CanBeUsedAsMLP


class GatedMLP(CanBeUsedAsMLP, _GlassboxGatedMLP):
    _glassbox_class = _GlassboxGatedMLP

    def __init__(self, cfg):
        tl_cfg, gcfg = standalone_config(cfg, "GatedMLP")
        _GlassboxGatedMLP.__init__(self, gcfg.replace(gated_mlp=True, gated_mlp_bias="product"))
        self.cfg, self.d_mlp = tl_cfg, tl_cfg.d_mlp
        self.act_fn = self.act
        finish(self, tl_cfg)

    forward = _GlassboxGatedMLP.forward


__all__ = ["GatedMLP"]
