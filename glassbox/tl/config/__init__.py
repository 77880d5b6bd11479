"""TransformerLens's ``transformer_lens.config``: the HookedTransformer-era config class."""

from .hooked_transformer_config import HookedTransformerConfig

__all__ = ["HookedTransformerConfig"]
