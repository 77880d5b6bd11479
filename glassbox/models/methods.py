"""Convenience methods researchers call on the model: embedding inputs, losses, token directions.

They compute nothing the forward pass does not; each is a short composition of the model's own
modules, kept out of ``transformer.py`` so that file stays the computation alone.
"""


class ModelMethods:
    """Mixed into ``HookedTransformer``."""
