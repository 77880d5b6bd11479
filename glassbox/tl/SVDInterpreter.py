"""TransformerLens's ``SVDInterpreter``: singular vectors of OV, W_in and W_out read through W_U.

``SVDInterpreter(model).get_singular_vectors(vector_type, layer_index, num_vectors=10, head_index=None)``
returns [d_vocab 1 num_vectors], as TransformerLens does, from
``glassbox.interp.svd_interpreter.singular_vocab_directions`` (the same matrices; see its docstring).
Singular vectors are defined up to sign, so a column may be the negative of TransformerLens's.
"""

from typing import Optional

from torch import Tensor

from ..interp.svd_interpreter import KINDS, singular_vocab_directions

OUTPUT_EMBEDDING = "unembed.W_U"
VECTOR_TYPES = list(KINDS)


class SVDInterpreter:
    def __init__(self, model):
        self.model = model
        self.cfg = model.cfg

    def get_singular_vectors(self, vector_type: str, layer_index: int, num_vectors: int = 10,
                             head_index: Optional[int] = None) -> Tensor:
        """The top ``num_vectors`` singular vectors of ``vector_type`` ("OV" needs ``head_index``) in
        vocabulary space: [d_vocab 1 num_vectors]."""
        if vector_type not in KINDS:
            raise ValueError(f"Vector type must be in {VECTOR_TYPES}, instead got {vector_type!r}")
        if head_index is None and vector_type == "OV":
            raise ValueError("head_index is needed for the OV vector type (optional only for w_in and w_out)")
        # TransformerLens ignores head_index for w_in and w_out: so does this.
        head = head_index if vector_type == "OV" else None
        return singular_vocab_directions(self.model, vector_type, layer_index, head, num_vectors)[:, None, :]
