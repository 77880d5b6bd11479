"""TransformerLens's ``MLP``: ``MLP(cfg)`` built on its own, computing with glassbox's ``MLP`` (its base).

Parameters W_in [d_model d_mlp], b_in [d_mlp], W_out [d_mlp d_model], b_out [d_model] in ``cfg.dtype``
(uninitialised until loaded, as TransformerLens's), hooks ``hook_pre`` and ``hook_post`` [batch pos
d_mlp], ``act_fn`` the activation (TransformerLens's attribute; glassbox's is ``act``). An activation
glassbox's models do not build (``act_fn`` outside their list) is refused by the config, naming it.
"""

from ....models import MLP as _GlassboxMLP
from .._standalone import finish, standalone_config
from .can_be_used_as_mlp import CanBeUsedAsMLP


class MLP(CanBeUsedAsMLP, _GlassboxMLP):
    _glassbox_class = _GlassboxMLP

    def __init__(self, cfg):
        tl_cfg, gcfg = standalone_config(cfg, "MLP")
        _GlassboxMLP.__init__(self, gcfg)
        self.cfg, self.d_mlp = tl_cfg, tl_cfg.d_mlp
        self.act_fn = self.act
        finish(self, tl_cfg)

    forward = _GlassboxMLP.forward


__all__ = ["MLP"]
