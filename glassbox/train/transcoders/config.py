"""TranscoderTrainConfig: everything that shapes a transcoder-set training run (recorded in its checkpoint).

A run trains one TranscoderSet for every layer of the model at once: ``cross_layer=False`` (one
transcoder per layer, each reading ``blocks.{l}.<input_hook>`` and estimating ``blocks.{l}.<output_hook>``)
or ``cross_layer=True`` (features read at layer s estimate the outputs of layers s..n-1); with ``skip``
a linear skip ``x @ W_skip.T`` per layer (zeros at first). ``architecture``: ``"topk"`` (``k`` features per
position and source layer, selected, as the SAE trainer's TopK, by pre-activation times decoder norm) or
``"relu"`` (ReLU + ``l1_coefficient`` times the activations weighted by their decoder norms). For a
cross-layer feature the decoder norm is that of its decoders to every target layer together.

The learning-rate and L1 schedules are the SAE trainer's (``SAETrainConfig.lr_at`` / ``l1_at``).
"""

import math
from dataclasses import asdict, dataclass

from ..sae.trainer import SAETrainConfig

ARCHITECTURES = ("topk", "relu")


def _whole(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


@dataclass(frozen=True)
class TranscoderTrainConfig:
    input_hook: str
    d_transcoder: int
    context_size: int
    output_hook: str = "hook_mlp_out"
    cross_layer: bool = False
    skip: bool = False
    architecture: str = "topk"
    k: int = None
    l1_coefficient: float = 1.0
    l1_warmup_steps: int = 0
    steps: int = 1000
    batch_tokens: int = 4096
    lr: float = 3e-4
    lr_warmup_steps: int = 0
    lr_decay_steps: int = 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    seed: int = 0
    buffer_batches: int = 8
    model_batch: int = 16
    exclude_special_tokens: bool = True
    dead_feature_window: int = 1000
    decoder_init_norm: float = 0.1
    checkpoint_every: int = 0

    lr_at = SAETrainConfig.lr_at
    l1_at = SAETrainConfig.l1_at

    def __post_init__(self):
        from ...interp.transcoders.set import _block_hook

        _block_hook(self.input_hook, "input_hook")
        _block_hook(self.output_hook, "output_hook")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES} for a transcoder set, got "
                             f"{self.architecture!r}")
        for name in ("cross_layer", "skip", "exclude_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name, low in (("d_transcoder", 1), ("context_size", 2), ("l1_warmup_steps", 0), ("steps", 1),
                          ("batch_tokens", 1), ("lr_warmup_steps", 0), ("lr_decay_steps", 0), ("seed", 0),
                          ("buffer_batches", 1), ("model_batch", 1), ("dead_feature_window", 1),
                          ("checkpoint_every", 0)):
            _whole(name, getattr(self, name), low)
        if self.architecture == "topk":
            if self.k is None:
                raise ValueError("k (features kept per token and layer) is needed for architecture='topk'")
            _whole("k", self.k, 1)
            if self.k > self.d_transcoder:
                raise ValueError(f"k={self.k} is more than d_transcoder={self.d_transcoder}")
        elif self.k is not None:
            raise ValueError(f"k={self.k!r} is for architecture='topk'; 'relu' uses l1_coefficient")
        for name, low_open in (("l1_coefficient", False), ("lr", True), ("decoder_init_norm", True)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    value < 0 or (low_open and value == 0):
                raise ValueError(f"{name} must be a finite number {'>' if low_open else '>='} 0, got {value!r}")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.lr_warmup_steps + self.lr_decay_steps > self.steps:
            raise ValueError(f"lr_warmup_steps ({self.lr_warmup_steps}) + lr_decay_steps ({self.lr_decay_steps}) "
                             f"is more than steps ({self.steps})")

    def to_dict(self) -> dict:
        return asdict(self)
