"""What TransformerLens's components share when built on their own (``Attention(cfg)``, ``MLP(cfg)``).

``standalone_config(cfg, name)`` takes what TransformerLens's constructors take, a dict of
HookedTransformerConfig fields or a HookedTransformerConfig (a glassbox ``Config`` too), and returns
the HookedTransformerConfig (the component's ``cfg``) and the glassbox Config its glassbox module is
built from. ``finish(module, cfg)`` gives the parameters TransformerLens's dtype (``cfg.dtype``);
like TransformerLens's, a standalone component is made on the CPU (move it with ``.to``), and its
weights are uninitialised (``torch.empty``) until loaded.

``CfgFlags`` lets a glassbox attention read the hook flags from the TransformerLens config at each
forward, as TransformerLens's components read ``cfg.use_attn_result``.
"""

from typing import Tuple

import torch
from torch import nn

from ...models import Config
from ..config import HookedTransformerConfig


def standalone_config(cfg, name: str) -> Tuple[HookedTransformerConfig, Config]:
    if not isinstance(cfg, (dict, Config)):
        raise TypeError(f"{name}(cfg): cfg must be a dict of HookedTransformerConfig fields or a "
                        f"HookedTransformerConfig, got {type(cfg).__name__}")
    tl_cfg = HookedTransformerConfig.unwrap(cfg)
    dtype = tl_cfg.dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name}(cfg): cfg.dtype must be a floating torch.dtype, got {dtype!r}")
    return tl_cfg, tl_cfg.component_glassbox()


def finish(module: nn.Module, tl_cfg: HookedTransformerConfig) -> None:
    """Cast the floating parameters and buffers to ``cfg.dtype``, in place."""
    module.to(tl_cfg.dtype)


class CfgFlags:
    """HookFlags' fields read from a TransformerLens config on every access."""

    def __init__(self, tl_cfg: HookedTransformerConfig):
        self._cfg = tl_cfg

    def __getattr__(self, name: str) -> bool:
        if name.startswith("_"):
            raise AttributeError(name)
        return bool(getattr(self._cfg, name))
