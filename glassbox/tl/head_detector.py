"""TransformerLens's ``head_detector``: ``detect_head`` with its pattern names, scores and defaults.

Maps onto ``glassbox.interp.heads.detect_head_matching`` (the "mul"/"abs" score, per-prompt mean)
with TransformerLens's rounding of "abs" to 3 decimals. Returns [n_layers n_heads] in the model's
dtype on the CPU, -1 for heads not asked for, as TransformerLens does. Deliberate differences: a
prompt of exactly n_ctx tokens is scored (TransformerLens refuses it), a list of prompts with a
custom pattern tensor is refused with a clear error (TransformerLens mis-indexes the padded batch).
Bad arguments raise an ``ArgumentError``: a ValueError that is also TransformerLens's AssertionError,
with TransformerLens's message where it has one.
glassbox's own score (mean per query) stays ``glassbox.interp.detect_head``.
"""

from typing import Dict, List, Literal, Optional, Tuple, Union

from torch import Tensor

from ..hooks.errors import ArgumentError
from ..interp.heads import detect_head_matching, detection_pattern, match_scores
from ..interp.tensor_utils import is_lower_triangular

HeadName = Literal["previous_token_head", "duplicate_token_head", "induction_head"]  # TransformerLens's type names
ErrorMeasure = Literal["abs", "mul"]
HEAD_NAMES = ("previous_token_head", "duplicate_token_head", "induction_head")  # a tuple, as in 3.9
ERROR_MEASURES = ("abs", "mul")
# TransformerLens's messages, which its tests compare
INVALID_HEAD_NAME_ERR = f"detection_pattern must be a Tensor or one of head names: {HEAD_NAMES}; got %s"
CACHE_WITH_SEQ_LIST_ERR = ("A single cache cannot be reused across multiple prompts, so `cache` is not\n"
                           "supported when `seq` is a list. Pass one prompt at a time, or omit `cache`\n"
                           "and let each prompt be run separately.")
SEQ_LEN_ERR = "The sequence must be non-empty and must fit within the model's context window."
DET_PAT_NOT_SQUARE_ERR = ("The detection pattern must be a lower triangular matrix of shape (sequence_length, "
                          "sequence_length); sequence_length=%d; got detection pattern of shape %s")
_KINDS = {"previous_token_head": "previous_token", "duplicate_token_head": "duplicate_token",
          "induction_head": "induction"}


def detect_head(model, seq: Union[str, List[str]], detection_pattern: Union[Tensor, str],
                heads: Optional[Union[List[Tuple[int, int]], Dict[int, List[int]]]] = None, cache=None, *,
                exclude_bos: bool = False, exclude_current_token: bool = False,
                error_measure: str = "mul") -> Tensor:
    """Score every head (or those in ``heads``) against a detection pattern or a named head type."""
    # TransformerLens's checks in its words; every refusal is an ArgumentError (also its AssertionError)
    if error_measure not in ERROR_MEASURES:
        raise ArgumentError(f"Invalid error_measure={error_measure}; valid values are {ERROR_MEASURES}")
    if isinstance(detection_pattern, str):
        if detection_pattern not in _KINDS:
            raise ArgumentError(INVALID_HEAD_NAME_ERR % detection_pattern)
        detection_pattern = _KINDS[detection_pattern]
    if isinstance(seq, list) and cache is not None:
        raise ArgumentError(CACHE_WITH_SEQ_LIST_ERR)
    if not isinstance(seq, list):
        tokens = seq if isinstance(seq, Tensor) else model.to_tokens(seq, truncate=False)  # too long: refused
        pos = tokens.shape[-1]
        if not 1 < pos <= model.cfg.n_ctx:  # a prompt of n_ctx tokens is scored (TransformerLens: refused)
            raise ArgumentError(SEQ_LEN_ERR)
        if isinstance(detection_pattern, Tensor) and (tuple(detection_pattern.shape) != (pos, pos)
                                                      or not is_lower_triangular(detection_pattern)):
            raise ArgumentError(DET_PAT_NOT_SQUARE_ERR % (pos, detection_pattern.shape))
        seq = tokens
    try:
        scores = detect_head_matching(model, seq, detection_pattern, heads, cache, error_measure=error_measure,
                                      exclude_bos=exclude_bos, exclude_current_token=exclude_current_token,
                                      decimals=3)
    except ArgumentError:
        raise
    except ValueError as error:  # glassbox's message, TransformerLens's type
        raise ArgumentError(str(error)) from None
    return scores.to(device="cpu", dtype=next(model.parameters()).dtype)


def compute_head_attention_similarity_score(attention_pattern: Tensor, detection_pattern: Tensor, *,
                                            exclude_bos: bool, exclude_current_token: bool,
                                            error_measure: str) -> float:
    """One head's score: its pattern [q_pos k_pos] against a detection pattern of the same shape."""
    return match_scores(attention_pattern[None, None], detection_pattern, error_measure, exclude_bos,
                        exclude_current_token, decimals=3).item()


def _named_pattern(kind: str):
    def get_pattern(tokens: Tensor) -> Tensor:
        return detection_pattern(kind, tokens.reshape(1, -1))[0]

    get_pattern.__doc__ = f"The [pos pos] detection pattern of a {kind.replace('_', ' ')} head for tokens [1 pos]."
    return get_pattern


get_previous_token_head_detection_pattern = _named_pattern("previous_token")
get_duplicate_token_head_detection_pattern = _named_pattern("duplicate_token")
get_induction_head_detection_pattern = _named_pattern("induction")


def get_supported_heads() -> None:
    """Print the supported head names."""
    print(f"Supported heads: {HEAD_NAMES}")
