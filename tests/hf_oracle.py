"""Independent oracles for the tutorials: the shipped model run by ``transformers`` alone.

The shipped folder is a Hugging Face GPT-2 folder; ``GPT2LMHeadModel`` loads it without glassbox, and
the patches and ablations the tutorials make with glassbox's engine are redone here with plain PyTorch
hooks on the ``transformers`` modules (a block's input is the residual stream entering it; the input
of ``attn.c_proj`` is every head's z, heads side by side).
"""

import contextlib
from pathlib import Path

import torch

import glassbox

SHIPPED = Path(glassbox.__file__).resolve().parent / "assets" / "models" / "glassbox-austen"
SHIPPED_SAE = Path(glassbox.__file__).resolve().parent / "assets" / "saes" / "glassbox-austen-L1-resid-pre"
BOS = 4095  # the shipped config's bos_token_id


def hf_model():
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(SHIPPED, attn_implementation="eager").eval()


def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SHIPPED)


def tokens_of(tokenizer, text: str) -> torch.Tensor:
    """BOS, then the text's ids: [1 pos]."""
    return torch.tensor([[BOS, *tokenizer(text)["input_ids"]]])


def token_id(tokenizer, word: str) -> int:
    ids = tokenizer(word)["input_ids"]
    assert len(ids) == 1, (word, ids)
    return ids[0]


@contextlib.contextmanager
def replaced_input(module, fn):
    """While open, ``module``'s first input x is replaced by ``fn(x)`` (which may edit a copy)."""

    def pre_hook(mod, args, kwargs):
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
        return args, {**kwargs, key: fn(kwargs[key])}

    handle = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def recorded_input(model, module, tokens) -> torch.Tensor:
    """``module``'s first input on a run of ``tokens``."""
    seen = []
    with replaced_input(module, lambda x: seen.append(x.detach().clone()) or x), torch.no_grad():
        model(tokens)
    return seen[0]


def logit_diff(logits, answer, distractor) -> torch.Tensor:
    """[batch]: logit of answer minus distractor at the last position (ids or [batch] tensors)."""
    last = logits[:, -1]
    rows = torch.arange(last.shape[0])
    return last[rows, answer] - last[rows, distractor]


def head_slice(model, head: int) -> slice:
    d_head = model.config.n_embd // model.config.n_head
    return slice(head * d_head, (head + 1) * d_head)


def sae_weights() -> dict:
    from safetensors.torch import load_file

    return load_file(SHIPPED_SAE / "sae_weights.safetensors")


def topk_encode(x: torch.Tensor, w: dict, k: int = 32) -> torch.Tensor:
    """SAELens's TopK encoder written out: ReLU of the k largest of (x - b_dec) @ W_enc + b_enc."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    top = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
