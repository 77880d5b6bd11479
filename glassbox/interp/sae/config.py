"""SAEConfig: what an SAE or transcoder is and where it reads and writes.

Field names follow SAELens's ``cfg.json`` (``d_in``, ``d_sae``, ``apply_b_dec_to_input``,
``normalize_activations``, ``reshape_activations``, ``metadata.hook_name``...), so that a folder
written by one loads in the other (``format.py`` maps the keys). ``hook_name`` is where the SAE reads;
``hook_name_out`` is where a transcoder writes (None for an SAE, which writes where it reads).
``metadata`` keeps the rest of SAELens's metadata (model_name, context_size, prepend_bos, ...).
"""

from dataclasses import asdict, dataclass, field
from typing import Optional

NORMALIZATIONS = ("none",)
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
    k: Optional[int] = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SAEConfig.{name} must be a positive int, got {value!r}")
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

    def to_dict(self) -> dict:
        return asdict(self)
