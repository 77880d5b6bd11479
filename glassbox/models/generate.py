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
  default) means the tokenizer's EOS when the model has a tokenizer, otherwise none. A list of ids
  stops a row at any of them; finished rows then receive the tokenizer's EOS when it has one, else
  the list's first id (TransformerLens's rule).
- ``freq_penalty`` (sampling only) subtracts ``freq_penalty * count`` from each token's tempered
  logit, counting the real tokens of the row so far (prompt and new; pads are not counted, where
  TransformerLens counts them). ``verbose`` shows a tqdm progress bar over the steps.
- ``generate_from_embeds`` continues from token embeddings (a soft prompt), recomputing every step.
- On a model placed across devices (``glassbox.models.devices``) each block's keys and values stay on
  its device; the tokens, the sampling and the returned logits are on the embed's device.
- ``generate_tl_style`` is TransformerLens's ``HookedTransformer.generate`` (its argument names,
  defaults and return types) in terms of ``generate``.

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
                generator: Optional[torch.Generator] = None,
                penalty: Optional[Float[Tensor, "batch d_vocab"]] = None) -> Int[Tensor, "batch"]:
    """The next token of each row: argmax, or a draw after temperature, ``penalty`` (subtracted from
    the tempered logits), top-k and top-p."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if penalty is not None:
        logits = logits - penalty
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
             padding_side: str = "left", output_logits: bool = False, freq_penalty: float = 0.0,
             verbose: bool = False):
    """Continue each prompt by up to ``max_new_tokens`` tokens.

    Returns token ids [batch pos + new] (prompt, padding included, then the new tokens), or
    (tokens, logits [batch new d_vocab]) with ``output_logits``: the logits each new token was
    chosen from, before temperature and penalty.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    for name, flag in (("do_sample", do_sample), ("use_past_kv_cache", use_past_kv_cache),
                       ("output_logits", output_logits), ("verbose", verbose)):
        check_flag(name, flag)
    _check_penalty(freq_penalty, do_sample)
    tokens, mask = model.input_to_tokens(input, attention_mask, prepend_bos, padding_side)
    model.check_tokens(tokens)
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"{tokens.shape[1]} prompt tokens + max_new_tokens={max_new_tokens} exceed "
                         f"n_ctx={model.cfg.n_ctx}")
    stops, eos = _eos_ids(model, eos_token_id)
    counts = _token_counts(tokens, mask, model.cfg.d_vocab) if freq_penalty else None
    generator = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
    points = list(model.hook_dict.values())
    kv = KVCache(model.cfg.n_layers) if use_past_kv_cache else None
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    out, full_mask, step_logits = tokens, mask, []
    # Claimed outside the try: a refused claim must not clear the owner's ctx["step"].
    with model.hook_guard.claim("generate"):
        try:
            with torch.no_grad():
                for step in _steps(max_new_tokens, verbose):
                    for point in points:
                        point.ctx["step"] = step
                    if kv is None:
                        last = get_last_token_logits(model(out, attention_mask=full_mask), full_mask)
                    elif step == 0:
                        last = get_last_token_logits(model(tokens, attention_mask=mask, past_kv_cache=kv), mask)
                    else:
                        last = model(out[:, -1:], past_kv_cache=kv)[:, -1]
                    last = last.to(tokens.device)  # placed across devices: the unembed's may be another
                    step_logits.append(last)
                    penalty = freq_penalty * counts if counts is not None else None
                    new = sample_next(last, do_sample, temperature, top_k, top_p, generator, penalty)
                    if stops is not None:
                        new = torch.where(finished, torch.full_like(new, eos), new)
                        finished |= torch.isin(new, stops)
                    if counts is not None:
                        counts[torch.arange(len(new), device=new.device), new] += 1
                    out = torch.cat([out, new[:, None]], dim=1)
                    if full_mask is not None:
                        full_mask = torch.cat([full_mask, torch.ones_like(full_mask[:, :1])], dim=1)
                    if stops is not None and bool(finished.all()):
                        break
        finally:
            for point in points:
                point.ctx.pop("step", None)
    if not output_logits:
        return out
    d_vocab = model.cfg.d_vocab
    logits = torch.stack(step_logits, 1) if step_logits else tokens.new_zeros((tokens.shape[0], 0, d_vocab)).float()
    return out, logits


def generate_from_embeds(model, embeds: Float[Tensor, "batch pos d_model"], max_new_tokens: int,
                         do_sample: bool = False, temperature: float = 1.0, top_k: Optional[int] = None,
                         top_p: Optional[float] = None, eos_token_id=..., seed: Optional[int] = None,
                         output_logits: bool = False, verbose: bool = False) -> tuple:
    """Continue from token embeddings [batch pos d_model] (``model.embed(tokens)``: rows of W_E, times
    sqrt(d_model) under ``cfg.scale_embed``; or any vectors: a soft prompt).

    Each step's residual stream is the embeddings so far plus the position embeddings
    (``hook_pos_embed`` runs; ``hook_embed`` does not, the input being embeddings already), and the
    whole sequence is recomputed each step (no key-value cache). Every row is real (no padding).
    Sampling and EOS as in ``generate``. Returns (new tokens [batch new], embeddings
    [batch pos+new d_model]: the input, then ``model.embed`` of each new token), and the logits
    [batch new d_vocab] as a third element with ``output_logits``.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    for name, flag in (("do_sample", do_sample), ("output_logits", output_logits), ("verbose", verbose)):
        check_flag(name, flag)
    d_model, W_E = model.cfg.d_model, model.embed.W_E
    if not isinstance(embeds, Tensor) or embeds.ndim != 3 or embeds.shape[-1] != d_model or embeds.shape[1] == 0:
        raise ValueError(f"embeds must be [batch pos d_model={d_model}] with pos >= 1, got "
                         f"{tuple(embeds.shape) if isinstance(embeds, Tensor) else type(embeds).__name__}")
    if embeds.dtype != W_E.dtype or embeds.device != W_E.device:
        raise ValueError(f"embeds are {embeds.dtype} on {embeds.device}, the model {W_E.dtype} on {W_E.device}")
    if embeds.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"{embeds.shape[1]} positions + max_new_tokens={max_new_tokens} exceed n_ctx={model.cfg.n_ctx}")
    stops, eos = _eos_ids(model, eos_token_id)
    generator = torch.Generator(device=embeds.device).manual_seed(seed) if seed is not None else None
    points = list(model.hook_dict.values())
    finished = torch.zeros(embeds.shape[0], dtype=torch.bool, device=embeds.device)
    new_tokens, step_logits = [], []
    with model.hook_guard.claim("generate"):
        try:
            with torch.no_grad():
                for step in _steps(max_new_tokens, verbose):
                    for point in points:
                        point.ctx["step"] = step
                    resid = embeds
                    if model.pos_embed is not None:
                        positions = torch.arange(embeds.shape[1], device=embeds.device).expand(embeds.shape[:2])
                        resid = embeds + model.hook_pos_embed(model.pos_embed.lookup(positions))
                    last = model(resid, start_at_layer=0)[:, -1].to(embeds.device)
                    step_logits.append(last)
                    new = sample_next(last, do_sample, temperature, top_k, top_p, generator)
                    if stops is not None:
                        new = torch.where(finished, torch.full_like(new, eos), new)
                        finished |= torch.isin(new, stops)
                    new_tokens.append(new)
                    embeds = torch.cat([embeds, model.embed(new[:, None])], dim=1)
                    if stops is not None and bool(finished.all()):
                        break
        finally:
            for point in points:
                point.ctx.pop("step", None)
    batch = embeds.shape[0]
    tokens = torch.stack(new_tokens, 1) if new_tokens else torch.zeros(batch, 0, dtype=torch.long, device=embeds.device)
    if not output_logits:
        return tokens, embeds
    logits = torch.stack(step_logits, 1) if step_logits else embeds.new_zeros((batch, 0, model.cfg.d_vocab))
    return tokens, embeds, logits


def _check_options(max_new_tokens, temperature, top_k, top_p) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _check_penalty(freq_penalty, do_sample: bool) -> None:
    if isinstance(freq_penalty, bool) or not isinstance(freq_penalty, (int, float)) or not freq_penalty >= 0:
        raise ValueError(f"freq_penalty must be a number >= 0, got {freq_penalty!r}")
    if freq_penalty and not do_sample:
        raise ValueError(f"freq_penalty={freq_penalty!r} acts on sampling; with do_sample=False it would be "
                         "ignored (as TransformerLens ignores it): pass do_sample=True or freq_penalty=0")


def _steps(n: int, verbose: bool):
    if not verbose:
        return range(n)
    from tqdm import tqdm

    return tqdm(range(n))


def _token_counts(tokens: Tensor, mask: Optional[Tensor], d_vocab: int) -> Tensor:
    """[batch d_vocab] float: how often each id occurs among each row's real tokens."""
    weights = torch.ones(tokens.shape, device=tokens.device) if mask is None else mask.float()
    counts = torch.zeros(tokens.shape[0], d_vocab, device=tokens.device)
    return counts.scatter_add_(1, tokens.long(), weights)


def repetition_penalized(logits: Float[Tensor, "batch d_vocab"], tokens: Integer[Tensor, "batch pos"],
                         penalty: float) -> Float[Tensor, "batch d_vocab"]:
    """Hugging Face's repetition penalty, as a new tensor: the logit of each id that occurs in a row of
    ``tokens`` is divided by ``penalty`` where it is positive and multiplied by it where it is not."""
    if tokens.ndim != 2 or tokens.shape[0] != logits.shape[0]:
        raise ValueError(f"tokens must be [batch={logits.shape[0]} pos] ids, got shape {tuple(tokens.shape)}")
    seen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, tokens.long().to(logits.device), True)
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def _tokenizer_eos(model) -> Optional[int]:
    try:
        tokenizer = model.tokenizer
    except ValueError:
        return None
    return tokenizer.eos_token_id


def _eos_ids(model, eos_token_id) -> tuple:
    """(the stop ids as a tensor or None, the id finished rows receive)."""
    if eos_token_id is ...:
        eos_token_id = _tokenizer_eos(model)
    if eos_token_id is None:
        return None, None
    device = model.cfg_device()
    if isinstance(eos_token_id, (int, np.integer)) and not isinstance(eos_token_id, (bool, np.bool_)):
        ids = [int(eos_token_id)]
    elif isinstance(eos_token_id, (list, tuple)) and eos_token_id and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in eos_token_id):
        ids = [int(i) for i in eos_token_id]
    else:
        raise ValueError(f"eos_token_id must be a token id, a non-empty list of ids, None or ..., got {eos_token_id!r}")
    for i in ids:
        if not 0 <= i < model.cfg.d_vocab:
            raise ValueError(f"eos_token_id {i} is outside [0, d_vocab={model.cfg.d_vocab})")
    pad = ids[0]
    if len(ids) > 1:
        tokenizer_eos = _tokenizer_eos(model)
        pad = tokenizer_eos if tokenizer_eos is not None else ids[0]
    return torch.tensor(ids, device=device), pad


TL_RETURN_TYPES = ("input", "str", "tokens", "embeds")


def generate_tl_style(model, input: Union[str, list, Tensor] = "", max_new_tokens: int = 10, stop_at_eos: bool = True,
                      eos_token_id=None, do_sample: bool = True, top_k: Optional[int] = None,
                      top_p: Optional[float] = None, temperature: float = 1.0, freq_penalty: float = 0.0,
                      use_past_kv_cache: bool = True, prepend_bos: Optional[bool] = None,
                      padding_side: Optional[str] = None, return_type: Optional[str] = "input",
                      verbose: bool = True, **generation_kwargs):
    """TransformerLens's ``HookedTransformer.generate``: its names, defaults and return types.

    - ``input``: text, a list of texts, token ids [batch pos], or token embeddings
      [batch pos d_model] (``generate_from_embeds``: no key-value cache, no freq_penalty).
    - ``return_type``: "input" (text in -> text out, ids in -> ids out, embeddings in -> embeddings
      out), "str" (each row decoded without special tokens: one string for one row, else a list),
      "tokens" (ids [batch pos + new], the prompt included) or "embeds" (``model.embed`` of those
      ids [batch pos + new d_model], no positions, hooks not run). From embeddings, "tokens" and
      "str" give the new tokens only, and "embeds" the input followed by the new tokens' embeddings.
    - ``stop_at_eos``: stop at ``eos_token_id`` (an id or a list of ids; None: the tokenizer's EOS,
      an error without one); finished rows are padded with the EOS. ``temperature=0`` or
      ``do_sample=False`` is greedy. ``top_k`` wins over ``top_p`` when both are given, as there.
    - A list of several strings is padded on the left (TransformerLens forces it); one string or
      token ids use ``padding_side`` (None: the tokenizer's). Every given token id is read as real
      (TransformerLens masks trailing pad ids of a token input).
    - ``output_logits=True`` (the one ``generation_kwargs`` key, as there) returns a
      ``transformers`` ``GenerateDecoderOnlyOutput`` with ``sequences`` and ``logits`` (a tuple of
      [batch d_vocab], one per new token); other keys are refused by name.
    Sampling draws from torch's
    global generator, as TransformerLens does, though not the same draws; top-p keeps a token when
    the tokens ranked before it hold less than top_p (TransformerLens: at most top_p, a difference
    only at exact equality); freq_penalty counts real tokens only (TransformerLens also counts pads).
    """
    output_logits = generation_kwargs.pop("output_logits", False)
    generation_kwargs.pop("return_dict_in_generate", None)
    if generation_kwargs:
        raise TypeError(f"generate got unsupported arguments {sorted(generation_kwargs)}; the supported "
                        "generation keyword is output_logits")
    if return_type not in TL_RETURN_TYPES:
        raise ValueError(f"return_type must be one of {list(TL_RETURN_TYPES)}, got {return_type!r}")
    for name, flag in (("stop_at_eos", stop_at_eos), ("do_sample", do_sample), ("output_logits", output_logits)):
        check_flag(name, flag)
    from_embeds = isinstance(input, Tensor) and input.ndim == 3
    if return_type == "input":
        return_type = "str" if isinstance(input, (str, list)) else "embeds" if from_embeds else "tokens"
    if isinstance(input, list) and len(input) > 1:
        padding_side = "left"
    eos = None
    if stop_at_eos:
        eos = eos_token_id if eos_token_id is not None else _tokenizer_eos(model)
        if eos is None:
            raise ValueError("stop_at_eos=True needs an eos_token_id: the model has no tokenizer with an EOS")
    greedy = not do_sample or temperature == 0
    sampling = dict(do_sample=not greedy, temperature=1.0 if greedy else temperature, top_k=None if greedy else top_k,
                    top_p=None if greedy or top_k is not None else top_p, eos_token_id=eos,
                    output_logits=output_logits, verbose=verbose)
    if from_embeds:
        if freq_penalty:
            raise ValueError("freq_penalty needs the prompt's tokens; it does not apply to embeddings input")
        tokens, embeds, *logits = generate_from_embeds(model, input, max_new_tokens, **sampling)
        logits = logits[0] if logits else None
    else:
        result = generate(model, input, max_new_tokens, use_past_kv_cache=use_past_kv_cache, prepend_bos=prepend_bos,
                          padding_side=model.resolve_padding_side(padding_side),
                          freq_penalty=0.0 if greedy else freq_penalty, **sampling)
        tokens, logits = result if output_logits else (result, None)
    if output_logits:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=tokens, logits=tuple(logits.unbind(1)))
    if return_type == "tokens":
        return tokens
    if return_type == "embeds":
        if from_embeds:
            return embeds
        with torch.no_grad():
            return model.embed(tokens)
    texts = [model.tokenizer.decode(row, skip_special_tokens=True) for row in tokens.tolist()]
    return texts[0] if len(texts) == 1 else texts
