"""Dead features: which features stopped firing, and (ReLU SAEs) resampling them.

``steps_since_fired`` counts, per feature, the training steps since it last fired on any token of a
batch (SAELens's ``n_forward_passes_since_fired``); a feature is dead when the count is above
``dead_feature_window`` (SAELens's rule, default 1000 steps). A TopK SAE feeds the dead mask to the
AuxK loss (``losses.py``). A ReLU SAE resamples its dead features every ``feature_sampling_window``
steps, the recipe of Anthropic's "Towards Monosemanticity" (2023), as SAELens once did:
- an input row of the current batch is drawn for each dead feature, with probability proportional to
  the square of its reconstruction error ``|x - x_hat|^2`` (with replacement, on the trainer's
  generator);
- the feature's decoder row becomes that row minus ``b_dec``, at unit norm; its encoder column the
  same direction at 0.2 times the mean encoder-column norm of the live features (1 if none live);
  its encoder bias 0;
- Adam's moment estimates of those entries are zeroed, and the features count as just fired.
"""

import torch
from torch import Tensor

from ...interp.sae.base import SAE


class DeadFeatures:
    """``steps_since_fired`` [d_sae] on the SAE's device; ``update`` after every step.

    Also each feature's firing count over the tokens of the current sparsity window (SAELens's
    ``act_freq_scores``, reset by ``reset_window`` every ``feature_sampling_window`` steps), whose
    ``log_sparsity`` is what SAELens saves as ``sparsity.safetensors``."""

    def __init__(self, d_sae: int, window: int, device):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"dead_feature_window must be a whole number >= 1, got {window!r}")
        self.window = window
        self.steps_since_fired = torch.zeros(d_sae, dtype=torch.long, device=device)
        self.fire_counts = torch.zeros(d_sae, dtype=torch.long, device=device)
        self.window_tokens = 0

    @torch.no_grad()
    def update(self, feature_acts: Tensor) -> None:
        firing = feature_acts != 0
        fired = firing.any(dim=0)
        self.steps_since_fired += 1
        self.steps_since_fired[fired] = 0
        self.fire_counts += firing.sum(dim=0)
        self.window_tokens += feature_acts.shape[0]

    def reset_window(self) -> None:
        self.fire_counts.zero_()
        self.window_tokens = 0

    def log_sparsity(self) -> Tensor:
        """log10 of each feature's firing frequency over the window (+1e-10, as SAELens), on the CPU."""
        freq = self.fire_counts.double().cpu() / max(self.window_tokens, 1)
        return torch.log10(freq + 1e-10).float()

    def mask(self) -> Tensor:
        return self.steps_since_fired > self.window


@torch.no_grad()
def resample_dead(sae: SAE, optimizer: torch.optim.Optimizer, x: Tensor, sae_out: Tensor, dead: Tensor,
                  generator: torch.Generator) -> int:
    """Resample the features in ``dead`` (see module docstring); returns how many."""
    index = dead.nonzero()[:, 0]
    if index.numel() == 0:
        return 0
    error = (x - sae_out).float().pow(2).sum(-1).pow(2).double().cpu()
    if not error.sum() > 0:
        return 0  # a perfect reconstruction leaves nothing to aim the features at
    rows = torch.multinomial(error, index.numel(), replacement=True, generator=generator)
    directions = x[rows.to(x.device)] - sae.b_dec
    directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    alive = ~dead
    enc_norms = sae.W_enc.norm(dim=0)
    scale = 0.2 * (enc_norms[alive].mean() if alive.any() else enc_norms.new_ones(()))
    sae.W_dec[index] = directions.to(sae.W_dec.dtype)
    sae.W_enc[:, index] = (directions * scale).T.to(sae.W_enc.dtype)
    sae.b_enc[index] = 0
    for param, where in ((sae.W_dec, (index,)), (sae.W_enc, (slice(None), index)), (sae.b_enc, (index,))):
        state = optimizer.state.get(param, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][where] = 0
    return int(index.numel())
