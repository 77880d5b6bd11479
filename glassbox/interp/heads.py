"""Head detection: how much of each head's attention lands where a kind of head would put it.

A detection pattern D [batch query_pos key_pos] marks, for each query, the keys a head of that kind
attends to:
- "previous_token": the key just before the query;
- "duplicate_token": earlier keys holding the query's token;
- "induction": keys just after an earlier occurrence of the query's token;
- or a custom tensor [query_pos key_pos] or [batch query_pos key_pos] with values in [0, 1].

score[layer, head] = mean over queries with at least one marked key of sum_k pattern[q, k] * D[q, k]:
the share of attention on the marked keys, 1.0 for a perfect head. Queries with nothing marked (the
first token for previous-token heads) are left out rather than counted as misses, as are padded
queries; padded keys are never marked. ``exclude_bos`` renormalises each query's attention without
the first real token, for heads that park their spare attention there.

``induction_score`` builds its own input: random tokens, distinct within a segment, repeated
``n_repeats`` times, so each later query has exactly one induction target per earlier repeat.
"""

from typing import Optional, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .activation_cache import ActivationCache

HEAD_KINDS = ("previous_token", "duplicate_token", "induction")


def detection_pattern(kind: str, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch query_pos key_pos"]:
    """The binary detection pattern of a named kind of head for these tokens."""
    batch, pos = tokens.shape
    causal_strict = torch.ones(pos, pos, dtype=torch.bool, device=tokens.device).tril(-1)
    if kind == "previous_token":
        marked = torch.eye(pos, dtype=torch.bool, device=tokens.device).roll(-1, dims=1) & causal_strict
        return marked.expand(batch, pos, pos).float()
    same = tokens[:, :, None] == tokens[:, None, :]  # [batch query key]: key holds the query's token
    duplicate = same & causal_strict
    if kind == "duplicate_token":
        return duplicate.float()
    if kind == "induction":
        # Key k follows an earlier occurrence at k-1 < q: the duplicate pattern shifted one key right.
        induction = torch.zeros_like(duplicate)
        induction[:, :, 1:] = duplicate[:, :, :-1]
        return induction.float()
    raise ValueError(f"unknown head kind {kind!r}; use one of {HEAD_KINDS} or a detection pattern tensor")


def detect_head(model, tokens_or_cache: Union[Int[Tensor, "batch pos"], str, list, ActivationCache],
                kind: Union[str, Tensor] = "previous_token", exclude_bos: bool = False,
                attention_mask: Optional[Tensor] = None) -> Float[Tensor, "layer head"]:
    """Score every head for a kind of attention; see the module docstring for the score.

    ``tokens_or_cache``: token ids or text (the patterns are computed, stopping after the last
    layer's pattern), or an ActivationCache holding every layer's ``hook_pattern`` and its tokens.
    """
    cache = tokens_or_cache if isinstance(tokens_or_cache, ActivationCache) else None
    if cache is None:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens_or_cache, names_filter=lambda n: n.endswith("hook_pattern"),
                                            return_type=None, attention_mask=attention_mask)
    if not cache.has_batch_dim:
        raise ValueError("detect_head needs a cache with its batch axis (remove_batch_dim=False)")
    patterns = torch.stack([cache["pattern", l] for l in range(model.cfg.n_layers)])  # layer batch head q k
    device = patterns.device
    batch, pos = patterns.shape[1], patterns.shape[-1]
    marked = _marked(kind, cache.tokens, batch, pos, device)
    mask = cache.attention_mask
    mask = mask.to(device) if mask is not None else torch.ones(batch, pos, dtype=torch.bool, device=device)
    marked = marked * mask[:, None, :]
    patterns = patterns.float()
    if exclude_bos:
        first = mask.long().argmax(-1)  # first real token of each row
        keep = torch.ones(batch, pos, device=device).scatter(1, first[:, None], 0.0)
        patterns = patterns * keep[None, :, None, None, :]
        patterns = patterns / patterns.sum(-1, keepdim=True).clamp(min=1e-30)
    rows = (marked.sum(-1) > 0) & mask  # [batch query]
    if not bool(rows.any()):
        raise ValueError("no query has a marked key for these tokens (e.g. duplicate_token or induction "
                         "heads need repeated tokens)")
    on_target = (patterns * marked[None, :, None]).sum(-1)  # layer batch head query
    return (on_target * rows[None, :, None]).sum((1, 3)) / rows.sum()


def _marked(kind, tokens: Optional[Tensor], batch: int, pos: int, device) -> Tensor:
    if isinstance(kind, Tensor):
        marked = kind.to(device).float()
        if marked.ndim == 2:
            marked = marked.expand(batch, pos, pos)
        if marked.shape != (batch, pos, pos):
            raise ValueError(f"a detection pattern is [query_pos key_pos] or [batch query_pos key_pos] = "
                             f"[{batch} {pos} {pos}], got shape {tuple(kind.shape)}")
        if bool((marked < 0).any()) or bool((marked > 1).any()):
            raise ValueError("detection pattern values must lie in [0, 1]")
        return marked
    if tokens is None:
        raise ValueError(f"the {kind!r} pattern depends on the tokens, and this cache does not hold them")
    return detection_pattern(kind, tokens.to(device))


def induction_tokens(model, seq_len: int, n_repeats: int = 2, batch: int = 4, seed: int = 0,
                     bos_token_id: Optional[int] = None) -> Int[Tensor, "batch pos"]:
    """Random segments of ``seq_len`` distinct tokens, each repeated ``n_repeats`` times (BOS first if given)."""
    vocab = model.cfg.d_vocab
    usable = torch.tensor([t for t in range(vocab) if t != bos_token_id]) if bos_token_id is not None else \
        torch.arange(vocab)
    width = seq_len * n_repeats + (bos_token_id is not None)
    if seq_len < 1 or n_repeats < 2:
        raise ValueError(f"induction needs seq_len >= 1 and n_repeats >= 2, got {seq_len}, {n_repeats}")
    if seq_len > len(usable):
        raise ValueError(f"seq_len={seq_len} distinct tokens do not fit in d_vocab={vocab}")
    if width > model.cfg.n_ctx:
        raise ValueError(f"{width} tokens (seq_len * n_repeats) exceed n_ctx={model.cfg.n_ctx}")
    gen = torch.Generator().manual_seed(seed)
    segments = torch.stack([usable[torch.randperm(len(usable), generator=gen)[:seq_len]] for _ in range(batch)])
    tokens = segments.repeat(1, n_repeats)
    if bos_token_id is not None:
        tokens = torch.cat([torch.full((batch, 1), bos_token_id), tokens], dim=1)
    return tokens.to(model.cfg_device())


def induction_score(model, seq_len: int, n_repeats: int = 2, batch: int = 4, seed: int = 0,
                    bos_token_id: Optional[int] = None, return_tokens: bool = False):
    """Induction scores [layer head] on repeated random tokens (and the tokens, if asked)."""
    tokens = induction_tokens(model, seq_len, n_repeats, batch, seed, bos_token_id)
    scores = detect_head(model, tokens, "induction")
    return (scores, tokens) if return_tokens else scores
