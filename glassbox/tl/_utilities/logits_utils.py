"""``transformer_lens.utilities.logits_utils``: ``sample_logits``, ``logits_to_df`` and
``_apply_repetition_penalty`` on glassbox's sampler (``glassbox.models.generate``).

``sample_logits`` keeps TransformerLens's contract: temperature 0 is greedy (after the repetition
penalty); otherwise the repetition penalty, then the temperature, the frequency penalty (subtracted,
times each id's count in ``tokens``), then top-k or, when top-k is None, top-p; the draw is
glassbox's (``torch.multinomial``), so a seeded draw is not TransformerLens's, while which tokens can
be drawn, and with which probabilities, are. Bad arguments raise ArgumentError (a ValueError and the
AssertionError TransformerLens raises). Footgun: TransformerLens's top-p keeps a token whose
preceding probabilities sum to exactly ``top_p``; glassbox drops it (a tie of floats only).
"""

from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ...hooks.errors import ArgumentError
from ...models.generate import repetition_penalized, sample_next


def _apply_repetition_penalty(logits: Float[Tensor, "batch d_vocab"], tokens: Int[Tensor, "batch pos"],
                              penalty: float) -> Float[Tensor, "batch d_vocab"]:
    return repetition_penalized(logits, tokens, penalty)


def sample_logits(final_logits: Float[Tensor, "batch d_vocab"], top_k: Optional[int] = None,
                  top_p: Optional[float] = None, temperature: float = 1.0, freq_penalty: float = 0.0,
                  repetition_penalty: float = 1.0, tokens: Optional[Int[Tensor, "batch pos"]] = None
                  ) -> Int[Tensor, "batch"]:
    """One token id per row of ``final_logits`` [batch d_vocab] (see the module's docstring)."""
    if not isinstance(final_logits, Tensor) or final_logits.ndim != 2:
        raise ArgumentError(f"final_logits must be a [batch d_vocab] tensor, got "
                            f"{tuple(final_logits.shape) if isinstance(final_logits, Tensor) else type(final_logits)}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ArgumentError(f"top_k has to be an int greater than 0, got {top_k!r}")
    if top_k is None and top_p is not None and not 0.0 < top_p <= 1.0:
        raise ArgumentError(f"top_p has to be in (0, 1], got {top_p!r}")
    if not temperature >= 0:
        raise ArgumentError(f"temperature must be >= 0, got {temperature!r}")
    if repetition_penalty != 1.0 and tokens is not None:
        final_logits = repetition_penalized(final_logits, tokens, repetition_penalty)
    if temperature == 0.0:
        return final_logits.argmax(dim=-1)
    penalty = None
    if freq_penalty > 0:
        if tokens is None or tokens.ndim != 2:
            raise ArgumentError("freq_penalty > 0 needs tokens [batch pos], the ids generated so far (not embeddings)")
        counts = torch.zeros(final_logits.shape, dtype=torch.float32, device=final_logits.device)
        counts.scatter_add_(1, tokens.long().to(final_logits.device),
                            torch.ones(tokens.shape, dtype=torch.float32, device=final_logits.device))
        penalty = freq_penalty * counts
    return sample_next(final_logits, do_sample=True, temperature=temperature, top_k=top_k,
                       top_p=None if top_k is not None else top_p, penalty=penalty)


def logits_to_df(logits: Float[Tensor, "d_vocab"], tokenizer=None, top_k: Optional[int] = None):
    """A pandas DataFrame of one position's logits [d_vocab], most probable first: ``token_index``,
    ``token_string`` (with a tokenizer), ``logit``, ``log_prob``, ``probability``; ``top_k`` rows at most."""
    import pandas as pd

    if not isinstance(logits, Tensor) or logits.ndim != 1:
        raise ArgumentError(f"logits must be a 1-D [d_vocab] tensor, got "
                            f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}")
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    order = torch.argsort(probs, descending=True)
    if top_k is not None:
        order = order[:top_k]
    ids = order.cpu().tolist()
    data = {"token_index": ids}
    if tokenizer is not None:
        data["token_string"] = [tokenizer.decode([i]) for i in ids]
    data["logit"] = logits[order].detach().cpu().tolist()
    data["log_prob"] = log_probs[order].detach().cpu().tolist()
    data["probability"] = probs[order].detach().cpu().tolist()
    return pd.DataFrame(data)


__all__ = ["logits_to_df", "sample_logits"]
