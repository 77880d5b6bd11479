"""SAEConfig: what an SAE or transcoder is and where it reads and writes.

Field names follow SAELens's ``cfg.json`` (``d_in``, ``d_sae``, ``apply_b_dec_to_input``,
``normalize_activations``, ``reshape_activations``, ``metadata.hook_name``...), so that a folder
written by one loads in the other (``format.py`` maps the keys). ``hook_name`` is where the SAE reads;
``hook_name_out`` is where a transcoder writes (None for an SAE, which writes where it reads).
``metadata`` keeps the rest of SAELens's metadata (model_name, context_size, prepend_bos, ...).

Architecture-specific fields: ``k`` (TopK: features kept per position, an int; BatchTopK: the mean
number kept per position over a batch, a float), ``rescale_acts_by_decoder_norm`` (TopK: select and
scale by pre-activation times decoder norm, SAELens's key), ``d_out`` (transcoders: the width written
at ``hook_name_out``; None means ``d_in``).

``normalize_activations`` (what the SAE computes at inference, as SAELens):
- ``"none"``;
- ``"constant_norm_rescale"``: encode scales each input row by ``sqrt(d_in) / ||x||`` (after
  ``hook_sae_input``, before subtracting ``b_dec``); decode divides by the same coefficient;
- ``"layer_norm"``: encode computes ``(x - mean) / (std + 1e-5)`` (``std`` unbiased, as
  ``torch.std``); decode multiplies by ``std`` and adds ``mean``.
Both keep the coefficient of the last ``encode`` for the next ``decode`` (SAELens's contract):
``decode`` must follow the ``encode`` of the same input. SAELens's other values are refused here:
``"expected_average_only_in"`` is a training-time scaling folded into the weights when an SAE is
saved (``format.load_sae`` folds it from ``activation_scaler.json`` or refuses), and
``"covariance_whitening"`` is not implemented.
"""

from dataclasses import asdict, dataclass, field
from typing import Optional, Union

NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
RESHAPES = ("none", "hook_z")


@dataclass
class SAEConfig:
    architecture: str
    d_in: int
    d_sae: int
    hook_name: str
    hook_name_out: Optional[str] = None
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    reshape_activations: str = "none"
    k: Optional[Union[int, float]] = None
    rescale_acts_by_decoder_norm: bool = False
    d_out: Optional[int] = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SAEConfig.{name} must be a positive int, got {value!r}")
        if self.d_out is not None and (isinstance(self.d_out, bool) or not isinstance(self.d_out, int)
                                       or self.d_out < 1):
            raise ValueError(f"SAEConfig.d_out must be a positive int or None, got {self.d_out!r}")
        if self.k is not None and (isinstance(self.k, bool) or not isinstance(self.k, (int, float)) or self.k <= 0):
            raise ValueError(f"SAEConfig.k must be a positive number or None, got {self.k!r}")
        if not isinstance(self.hook_name, str) or not self.hook_name:
            raise ValueError(f"SAEConfig.hook_name must name a hook point, got {self.hook_name!r}")
        if self.reshape_activations not in RESHAPES:
            raise ValueError(f"SAEConfig.reshape_activations must be one of {RESHAPES}, got "
                             f"{self.reshape_activations!r}")
        if self.reshape_activations == "hook_z" and not self.hook_name.endswith("hook_z"):
            raise ValueError(f"reshape_activations='hook_z' flattens heads at an attention hook_z; "
                             f"hook_name is {self.hook_name!r}")

    @property
    def is_transcoder(self) -> bool:
        return self.hook_name_out is not None and self.hook_name_out != self.hook_name

    @property
    def hook_out(self) -> str:
        """Where the output goes: ``hook_name_out`` for a transcoder, else ``hook_name``."""
        return self.hook_name_out or self.hook_name

    @property
    def d_output(self) -> int:
        """The width of the reconstruction: ``d_out`` for a transcoder, else ``d_in``."""
        return self.d_in if self.d_out is None else self.d_out

    def to_dict(self) -> dict:
        return asdict(self)
