"""The oracle for the TransformerLens-compatibility tests: TransformerLens 3.9 on glassbox's weights.

``tl_twin(model)`` builds a ``transformer_lens.HookedTransformer`` whose every parameter is a copy of
the glassbox model's (its config translated field by field, here, independently of glassbox.tl), so
any difference between the two is a difference in the computation. ``tiny_gpt2`` makes a small
GPT-2-style glassbox model with every LayerNorm and bias perturbed away from its initial value, so
weight processing and biases are exercised; ``tiny_model`` does the same for other configs.
"""

from typing import Optional

import torch

import transformer_lens
from glassbox import Config, HookedTransformer

GPT2_VOCAB = 50257


def tiny_model(seed: int = 0, init_range: float = 0.2, dtype: torch.dtype = torch.float32,
               **fields) -> HookedTransformer:
    """A glassbox model of ``Config(**fields)`` (small GPT-2-style defaults), weights seeded.

    ``init_range`` 0.2 (GPT-2 uses 0.02) makes attention patterns sharp, so a wrong head, position
    or mask moves the outputs by far more than float rounding.
    """
    options = dict(d_model=24, n_layers=2, n_heads=3, d_vocab=GPT2_VOCAB, n_ctx=64, d_mlp=44,
                   init_range=init_range)
    options.update(fields)
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**options), dtype=dtype)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith((".w",)):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
            elif name.split(".")[-1].startswith("b"):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
    return model


def tiny_gpt2(seed: int = 0, **fields) -> HookedTransformer:
    return tiny_model(seed, **fields)


def tl_config(cfg: Config, dtype: torch.dtype = torch.float32) -> "transformer_lens.HookedTransformerConfig":
    """TransformerLens's config for a glassbox Config, written out field by field."""
    positional = {"learned": "standard", "rotary": "rotary"}.get(cfg.positional)
    if positional is None or cfg.norm_placement != "pre":
        raise NotImplementedError(f"no TransformerLens twin for positional={cfg.positional!r}, "
                                  f"norm_placement={cfg.norm_placement!r}")
    options = dict(
        n_layers=cfg.n_layers, d_model=cfg.d_model, n_ctx=cfg.n_ctx, d_head=cfg.d_head, n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab, eps=cfg.layer_norm_eps,
        # TransformerLens's SoLU MLP ("solu_ln") is SoLU followed by a LayerNorm over d_mlp
        act_fn=f"{cfg.act_fn}_ln" if getattr(cfg, "mlp_ln", False) else cfg.act_fn,
        normalization_type=cfg.normalization, positional_embedding_type=positional,
        default_prepend_bos=cfg.default_prepend_bos, gated_mlp=cfg.gated_mlp,
        parallel_attn_mlp=cfg.parallel_attn_mlp, dtype=dtype, original_architecture="GPT2LMHeadModel",
        attn_only=bool(getattr(cfg, "attn_only", False)),
    )
    if positional == "rotary":
        options.update(rotary_dim=cfg.rotary_dim, rotary_base=cfg.rotary_base,
                       rotary_adjacent_pairs=cfg.rotary_style == "interleaved")
    return transformer_lens.HookedTransformerConfig(**options)


def tl_twin(model: HookedTransformer, tokenizer=None) -> "transformer_lens.HookedTransformer":
    """A TransformerLens 3.9 HookedTransformer with exactly ``model``'s weights (copies).

    Parameters glassbox leaves out (biases of a bias-free config, an untied model's b_U) are zeros
    in the twin, which is what their absence computes.
    """
    cfg = model.cfg
    dtype = model.W_E.dtype
    twin = transformer_lens.HookedTransformer(tl_config(cfg, dtype), tokenizer=tokenizer or model.tokenizer,
                                              move_to_device=False)
    ours = {name: t.detach() for name, t in model.state_dict().items()}
    ours["unembed.W_U"] = model.W_U.detach()
    theirs = twin.state_dict()
    loaded = {}
    for name, target in theirs.items():
        if name.endswith((".mask", ".IGNORE")) or "rotary_" in name:
            continue
        source = ours.get(name)
        if source is None and cfg.parallel_attn_mlp and ".ln2." in name:
            # TransformerLens's parallel block reads ln2 of resid_pre for the MLP; glassbox's MLP reads
            # ln1's output, as GPT-J does, so the twin's ln2 is a copy of ln1.
            source = ours.get(name.replace(".ln2.", ".ln1."))
        if source is None:
            if name.split(".")[-1].startswith("b"):
                source = torch.zeros_like(target)
            else:
                raise KeyError(f"TransformerLens parameter {name} has no glassbox counterpart")
        if tuple(source.shape) != tuple(target.shape):
            raise ValueError(f"{name}: glassbox {tuple(source.shape)}, TransformerLens {tuple(target.shape)}")
        loaded[name] = source.clone().to(target.dtype)
    missing = twin.load_state_dict(loaded, strict=False)
    unexpected = [k for k in missing.missing_keys if not k.endswith((".mask", ".IGNORE")) and "rotary_" not in k]
    if unexpected or missing.unexpected_keys:
        raise RuntimeError(f"twin left {unexpected} unloaded, {missing.unexpected_keys} unexpected")
    return twin.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def tokens(model: HookedTransformer, batch: int = 2, pos: int = 12, seed: int = 0,
           d_vocab: Optional[int] = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, d_vocab or model.cfg.d_vocab, (batch, pos), generator=generator)
