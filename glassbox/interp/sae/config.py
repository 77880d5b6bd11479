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

import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Union

NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
# SAELens's values: the two training-time ones are folded into the weights by load_sae (format.py)
SAELENS_NORMALIZATIONS = NORMALIZATIONS + ("expected_average_only_in", "covariance_whitening")
RESHAPES = ("none", "hook_z")


def field_problems(values: dict) -> list:
    """What is wrong with the types and ranges of SAEConfig fields in ``values`` (as read from a
    ``cfg.json``, before any conversion), each as 'key must be ..., got ...'. Booleans must be true or
    false (``bool("false")`` is True, so a string is never converted); integers must not be floats or
    bools."""
    problems = []

    def bad(key, want):
        problems.append(f"{key} must be {want}, got {values[key]!r}")

    def positive_int(value):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    for key in ("d_in", "d_sae"):
        if key in values and not positive_int(values[key]):
            bad(key, "a positive int")
    if values.get("d_out") is not None and not positive_int(values["d_out"]):
        bad("d_out", "a positive int or None")
    if "architecture" in values and (not isinstance(values["architecture"], str) or not values["architecture"]):
        bad("architecture", "an architecture name (a string)")
    for key in ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm"):
        if key in values and not isinstance(values[key], bool):
            bad(key, "true or false")
    if "hook_name" in values and (not isinstance(values["hook_name"], str) or not values["hook_name"]):
        bad("hook_name", "the name of a hook point (a string)")
    if values.get("hook_name_out") is not None and (not isinstance(values["hook_name_out"], str)
                                                    or not values["hook_name_out"]):
        bad("hook_name_out", "the name of a hook point (a string) or None")
    if "normalize_activations" in values and values["normalize_activations"] not in SAELENS_NORMALIZATIONS:
        bad("normalize_activations", f"one of {SAELENS_NORMALIZATIONS}")
    if "reshape_activations" in values and values["reshape_activations"] not in RESHAPES:
        bad("reshape_activations", f"one of {RESHAPES}")
    k = values.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0):
        bad("k", "a positive number or None")
    if "metadata" in values and not isinstance(values["metadata"], dict):
        bad("metadata", "a dict (a JSON object)")
    return problems


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
        problems = field_problems({name: getattr(self, name) for name in self.__dataclass_fields__})
        if problems:
            raise ValueError("; ".join(f"SAEConfig.{p}" for p in problems))
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
