"""The MLP with a norm after its activation (TransformerLens's SoLU MLP: ``Config.mlp_ln``).

pre = x @ W_in + b_in; mid = act(pre); post = ln(mid), a norm of the model's normalization over
d_mlp (its own w [d_mlp] and, for LayerNorm, b [d_mlp]); out = post @ W_out + b_out. Hooks, with
TransformerLens's names: ``hook_pre`` and ``hook_mid`` [batch pos d_mlp], the norm's ``ln.hook_scale``
[batch pos 1], ``ln.hook_normalized`` and ``ln.hook_out`` [batch pos d_mlp] (glassbox's norm hooks,
``layer_norm.py``), ``hook_post`` [batch pos d_mlp], the norm's output: what W_out reads.

Footgun: ``hook_post`` is after the norm, so it is not act(hook_pre) as in a plain MLP; the
activation's own output is ``hook_mid``. Weight processing treats ``ln`` as a norm whose reader is
W_out (``glassbox.weights.processing``: fold_ln folds its w and b into W_out and b_out).
"""

from jaxtyping import Float
from torch import Tensor

from ..hooks import HookPoint
from .config import Config
from .layer_norm import LayerNorm
from .mlp import MLP
from .ops import linear
from .rms_norm import RMSNorm


class NormedMLP(MLP):
    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.hook_mid = HookPoint()
        self.ln = (LayerNorm if cfg.normalization == "LN" else RMSNorm)(cfg, cfg.d_mlp)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        post = self.hook_post(self.ln(self.hook_mid(self.act(pre))))
        return linear(post, self.W_out, self.b_out)
