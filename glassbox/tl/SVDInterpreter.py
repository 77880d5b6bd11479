"""TransformerLens's ``SVDInterpreter``: singular vectors of OV, W_in and W_out read through W_U.

``SVDInterpreter(model).get_singular_vectors(vector_type, layer_index, num_vectors=10, head_index=None)``
returns [d_vocab 1 num_vectors], as TransformerLens does, from
``glassbox.interp.svd_interpreter.singular_vocab_directions`` (the same matrices; see its docstring).
Singular vectors are defined up to sign, so a column may be the negative of TransformerLens's. A
missing head index and a layer or head out of range raise an ``ArgumentError`` (a ValueError that is
also TransformerLens's AssertionError) with TransformerLens's message.
"""

from numbers import Integral
from typing import Optional

from torch import Tensor

from ..hooks.errors import ArgumentError
from ..interp.svd_interpreter import KINDS, singular_vocab_directions

OUTPUT_EMBEDDING = "unembed.W_U"
VECTOR_TYPES = list(KINDS)


def _index_in(value, size: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and 0 <= value < size


class SVDInterpreter:
    def __init__(self, model):
        self.model = model
        self.cfg = model.cfg

    def get_singular_vectors(self, vector_type: str, layer_index: int, num_vectors: int = 10,
                             head_index: Optional[int] = None) -> Tensor:
        """The top ``num_vectors`` singular vectors of ``vector_type`` ("OV" needs ``head_index``) in
        vocabulary space: [d_vocab 1 num_vectors]."""
        # TransformerLens's checks, in its order and words; an ArgumentError is also its AssertionError
        if head_index is None and vector_type not in ("w_in", "w_out"):
            raise ArgumentError(f"Head index optional only for w_in and w_out, got {vector_type}")
        if vector_type not in KINDS:
            raise ValueError(f"Vector type must be in {VECTOR_TYPES}, instead got {vector_type}")
        n_layers, n_heads = self.cfg.n_layers, self.cfg.n_heads
        if not _index_in(layer_index, n_layers):
            raise ArgumentError(f"Layer index must be between 0 and {n_layers - 1} but got {layer_index}")
        if vector_type == "OV" and not _index_in(head_index, n_heads):
            raise ArgumentError(f"Head index must be between 0 and {n_heads - 1} but got {head_index}")
        # TransformerLens ignores head_index for w_in and w_out: so does this.
        head = head_index if vector_type == "OV" else None
        return singular_vocab_directions(self.model, vector_type, layer_index, head, num_vectors)[:, None, :]
