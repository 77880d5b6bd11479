"""Autoregressive decoding with a key-value cache, and last-token reads that respect padding.

Contract:
- ``generate`` feeds the prompt once, then one new token per step, reusing every earlier key and
  value (``use_past_kv_cache=False`` recomputes the whole sequence each step instead; both give the
  same tokens). Greedy (argmax) unless ``do_sample``; sampling applies temperature, then top-k, then
  top-p, drawing from a generator seeded by ``seed`` so a seeded run repeats exactly.
- A padded batch (list of prompts) is padded on the left by default; right padding also works, since
  positions and the attention mask come from the padding mask, and each row's first new token is
  read at its own last real token.
- Hooks attached to the model fire at every step. Each step sets ``hook.ctx["step"]`` on every hook
  point (0 for the prompt pass, k for the k-th new token's pass); the key is removed afterwards.
  The calling thread owns the model's hook state until ``generate`` returns: a forward or a second
  ``generate`` on the same model from another thread raises ``RuntimeError`` instead of
  interleaving steps (use one model per thread, ``copy.deepcopy(model)``).
- Flags (``do_sample``, ``use_past_kv_cache``, ``output_logits``, ``prepend_bos``) must be bools:
  ``do_sample="False"`` is refused, not read as True.
- A row that emits ``eos_token_id`` is finished: it keeps receiving that id (GPT-2's pad) while the
  others continue, and decoding stops early once every row is finished. ``eos_token_id=...`` (the
  default) means the tokenizer's EOS when the model has a tokenizer, otherwise none.

Footgun: ``logits[:, -1]`` of a right-padded batch reads a pad; use ``get_last_token_logits``.
"""

from typing import Optional, Union

import numpy as np
import torch
from jaxtyping import Bool, Float, Int, Integer
from torch import Tensor

from .inputs import check_flag
from .kv_cache import KVCache


def last_token_positions(attention_mask: Bool[Tensor, "batch pos"], pos: Optional[int] = None) -> Int[Tensor, "batch"]:
    """Index of each row's last real token (mask True); an error for a row with none."""
    mask = attention_mask.bool()
    if pos is not None and mask.shape[-1] != pos:
        raise ValueError(f"attention_mask covers {mask.shape[-1]} positions, the activations {pos}")
    if not bool(mask.any(-1).all()):
        raise ValueError("a row of attention_mask has no real token")
    index = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask, index, -1).amax(-1)


def get_last_token_logits(logits: Float[Tensor, "batch pos d_vocab"],
                          attention_mask: Optional[Bool[Tensor, "batch pos"]] = None) -> Float[Tensor, "batch d_vocab"]:
    """Logits at each sequence's last real token: never a pad, whichever side the padding is on."""
    if attention_mask is None:
        return logits[:, -1]
    if attention_mask.shape != logits.shape[:2]:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, logits "
                         f"{tuple(logits.shape[:2])} (batch pos)")
    last = last_token_positions(attention_mask.to(logits.device))
    return logits[torch.arange(logits.shape[0], device=logits.device), last]


def sample_next(logits: Float[Tensor, "batch d_vocab"], do_sample: bool = False, temperature: float = 1.0,
                top_k: Optional[int] = None, top_p: Optional[float] = None,
                generator: Optional[torch.Generator] = None) -> Int[Tensor, "batch"]:
    """The next token of each row: argmax, or a draw after temperature, top-k and top-p."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token once the tokens ranked before it already hold top_p; the first always stays.
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


def generate(model, input: Union[str, list, Integer[Tensor, "batch pos"], np.ndarray], max_new_tokens: int,
             do_sample: bool = False,
             temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             eos_token_id=..., seed: Optional[int] = None, use_past_kv_cache: bool = True,
             attention_mask: Union[Tensor, np.ndarray, list, None] = None, prepend_bos: Optional[bool] = None,
             padding_side: str = "left", output_logits: bool = False):
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Returns token ids [batch pos + new] (prompt, padding included, then the new tokens), or
    (tokens, logits [batch new d_vocab]) with ``output_logits``: the logits each new token was
    chosen from, before temperature.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    for name, flag in (("do_sample", do_sample), ("use_past_kv_cache", use_past_kv_cache),
                       ("output_logits", output_logits)):
        check_flag(name, flag)
    tokens, mask = model.input_to_tokens(input, attention_mask, prepend_bos, padding_side)
    model.check_tokens(tokens)
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"{tokens.shape[1]} prompt tokens + max_new_tokens={max_new_tokens} exceed "
                         f"n_ctx={model.cfg.n_ctx}")
    eos = _eos_id(model, eos_token_id)
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    points = list(model.hook_dict.values())
    kv = KVCache(model.cfg.n_layers) if use_past_kv_cache else None
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    out, full_mask, step_logits = tokens, mask, []
    # Claimed outside the try: a refused claim must not clear the owner's ctx["step"].
    with model.hook_guard.claim("generate"):
        try:
            with torch.no_grad():
                for step in range(max_new_tokens):
                    for point in points:
                        point.ctx["step"] = step
                    if kv is None:
                        last = get_last_token_logits(model(out, attention_mask=full_mask), full_mask)
                    elif step == 0:
                        last = get_last_token_logits(model(tokens, attention_mask=mask, past_kv_cache=kv), mask)
                    else:
                        last = model(out[:, -1:], past_kv_cache=kv)[:, -1]
                    step_logits.append(last)
                    new = sample_next(last, do_sample, temperature, top_k, top_p, generator)
                    if eos is not None:
                        new = torch.where(finished, torch.full_like(new, eos), new)
                        finished |= new == eos
                    out = torch.cat([out, new[:, None]], dim=1)
                    if full_mask is not None:
                        full_mask = torch.cat([full_mask, torch.ones_like(full_mask[:, :1])], dim=1)
                    if eos is not None and bool(finished.all()):
                        break
        finally:
            for point in points:
                point.ctx.pop("step", None)
    if not output_logits:
        return out
    d_vocab = model.cfg.d_vocab
    logits = torch.stack(step_logits, 1) if step_logits else tokens.new_zeros((tokens.shape[0], 0, d_vocab)).float()
    return out, logits


def _check_options(max_new_tokens, temperature, top_k, top_p) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _eos_id(model, eos_token_id) -> Optional[int]:
    if eos_token_id is not ...:
        return eos_token_id
    try:
        tokenizer = model.tokenizer
    except ValueError:
        return None
    return tokenizer.eos_token_id
