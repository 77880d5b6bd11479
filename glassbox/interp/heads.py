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

``detect_head_matching`` is the other score in use (TransformerLens's ``detect_head``): one prompt's
whole pattern A [query_pos key_pos] against a detection pattern D of the same shape,
- error_measure "mul": sum(A * D) / sum(A), the share of all the head's attention (summed over
  queries) that falls on marked entries; queries with nothing marked still count in the total;
- error_measure "abs": 1 - sum |A - D| / pos, from -1 (opposite) to 1 (A == D): it also rewards the
  head for giving each marked key the weight D gives it;
with ``exclude_bos`` zeroing column 0 of A ("mul") or of |A - D| ("abs"), not renormalising, and
``exclude_current_token`` the diagonal likewise; over a list of prompts, the mean of each prompt's
score. The two scores rank heads alike but differ in value: glassbox's averages per query.

``induction_score`` builds its own input: random tokens, distinct within a segment, repeated
``n_repeats`` times, so each later query has exactly one induction target per earlier repeat.
"""

import warnings
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


ERROR_MEASURES = ("mul", "abs")


def match_scores(patterns: Float[Tensor, "layer head query_pos key_pos"], detection: Float[Tensor, "query_pos key_pos"],
                 error_measure: str = "mul", exclude_bos: bool = False, exclude_current_token: bool = False,
                 decimals: Optional[int] = None) -> Float[Tensor, "layer head"]:
    """The "mul" or "abs" match of each head's pattern with ``detection`` (see the module docstring).

    ``patterns`` are one prompt's, causal; ``detection`` must be lower triangular. ``decimals``
    rounds the "abs" distance sum |A - D| / pos (Python's round) before it is taken from 1, as
    TransformerLens does with 3; None keeps it exact. The inputs are never written.
    """
    if error_measure not in ERROR_MEASURES:
        raise ValueError(f"error_measure must be one of {ERROR_MEASURES}, got {error_measure!r}")
    pos = patterns.shape[-1]
    if patterns.shape[-2] != pos or tuple(detection.shape) != (pos, pos):
        raise ValueError(f"patterns {tuple(patterns.shape)} and detection pattern {tuple(detection.shape)} must be "
                         "square and of one size")
    detection = detection.to(patterns.device)
    keep = torch.ones(pos, pos, dtype=torch.bool, device=patterns.device)
    if exclude_bos:
        keep[:, 0] = False
    if exclude_current_token:
        keep.fill_diagonal_(False)
    if error_measure == "mul":
        attention = patterns * keep
        return (attention * detection).sum((-2, -1)) / attention.sum((-2, -1))
    distance = (patterns - detection).abs()
    if bool(distance.triu(1).any()):
        raise ValueError("attention or detection pattern has weight above the diagonal: the abs measure "
                         "compares causal (lower triangular) patterns")
    raw = (distance * keep).mean((-2, -1)) * pos
    if decimals is not None:
        raw = torch.tensor([round(v, decimals) for v in raw.flatten().tolist()], dtype=raw.dtype,
                           device=raw.device).reshape(raw.shape)
    return 1 - raw


def _layer_heads(heads, n_layers: int, n_heads: int) -> dict:
    """``heads`` (None, a list of (layer, head) or a dict layer -> heads) as layer -> list of heads."""
    if heads is None:
        return {layer: list(range(n_heads)) for layer in range(n_layers)}
    if isinstance(heads, dict):
        pairs = [(layer, head) for layer, hs in heads.items() for head in hs]
    else:
        try:
            pairs = [tuple(pair) for pair in heads]
        except TypeError:
            raise ValueError(f"heads must be a list of (layer, head) or a dict layer -> heads, got {heads!r}") from None
    chosen: dict = {}
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair):
            raise ValueError(f"heads: {pair!r} is not a (layer, head) pair of ints")
        layer, head = pair
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"heads: ({layer}, {head}) is outside {n_layers} layers x {n_heads} heads")
        chosen.setdefault(layer, []).append(head)
    return chosen


def detect_head_matching(model, seq: Union[str, list, Int[Tensor, "pos"], Int[Tensor, "1 pos"]],
                         pattern: Union[str, Tensor], heads=None, cache: Optional[ActivationCache] = None, *,
                         error_measure: str = "mul", exclude_bos: bool = False, exclude_current_token: bool = False,
                         decimals: Optional[int] = None) -> Float[Tensor, "layer head"]:
    """Each head's ``match_scores`` on a prompt (the mean over prompts for a list); -1 outside ``heads``.

    Args:
        seq: a prompt (text, BOS prepended as the model does, or one row of token ids), or a list of texts.
        pattern: a kind from ``HEAD_KINDS`` (computed per prompt) or a [pos pos] lower-triangular tensor.
        heads: None (all), a list of (layer, head) or a dict layer -> list of heads.
        cache: the prompt's cache (with or without its batch axis of 1) holding every chosen layer's
            pattern; only for a single prompt.
    Returns [layer head] in the patterns' dtype, on the model's device.
    """
    cfg = model.cfg
    if error_measure not in ERROR_MEASURES:
        raise ValueError(f"error_measure must be one of {ERROR_MEASURES}, got {error_measure!r}")
    if isinstance(pattern, str) and pattern not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {pattern!r}; use one of {HEAD_KINDS} or a detection pattern tensor")
    options = dict(error_measure=error_measure, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token,
                   decimals=decimals)
    if isinstance(seq, list):
        if not seq:
            raise ValueError("seq is an empty list of prompts")
        if cache is not None:
            raise ValueError("one cache holds one prompt's patterns: give cache only with a single prompt")
        if not isinstance(pattern, str):
            raise ValueError("a detection pattern tensor fits one prompt's length: give a single prompt, or a "
                             "head kind, which is computed for each prompt")
        return torch.stack([detect_head_matching(model, s, pattern, heads, **options) for s in seq]).mean(0)
    tokens = seq if isinstance(seq, Tensor) else model.to_tokens(seq)
    tokens = tokens.reshape(1, -1) if tokens.ndim == 1 else tokens
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"seq as tokens is one prompt [pos] or [1 pos], got shape {tuple(tokens.shape)}")
    pos = tokens.shape[1]
    if not 1 < pos <= cfg.n_ctx:
        raise ValueError(f"the prompt has {pos} tokens; head detection needs 2 to n_ctx={cfg.n_ctx}")
    if isinstance(pattern, str):
        detection = detection_pattern(pattern, tokens.to(model.cfg_device()))[0]
    else:
        detection = pattern
        if tuple(detection.shape) != (pos, pos) or bool(detection.triu(1).any()):
            raise ValueError(f"the detection pattern must be lower triangular [pos pos] = [{pos} {pos}] for this "
                             f"prompt, got shape {tuple(detection.shape)}")
        if error_measure == "mul" and not bool(((detection == 0) | (detection == 1)).all()):
            warnings.warn("detection pattern has values other than 0 and 1 with error_measure='mul'", stacklevel=2)
    chosen = _layer_heads(heads, cfg.n_layers, cfg.n_heads)
    if cache is None:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_pattern"),
                                            return_type=None)
    patterns = []
    for layer in sorted(chosen):
        p = cache["pattern", layer]
        p = p if not cache.has_batch_dim else p[0] if p.shape[0] == 1 else None
        if p is None or tuple(p.shape[-2:]) != (pos, pos):
            raise ValueError(f"the cache's layer {layer} pattern has shape {tuple(cache['pattern', layer].shape)}; "
                             f"this prompt needs [head {pos} {pos}] (one prompt)")
        patterns.append(p)
    scores = match_scores(torch.stack(patterns).detach(), detection, **options)
    out = torch.full((cfg.n_layers, cfg.n_heads), -1.0, dtype=scores.dtype, device=scores.device)
    for row, layer in enumerate(sorted(chosen)):
        out[layer, chosen[layer]] = scores[row, chosen[layer]]
    return out
