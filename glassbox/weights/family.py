"""``Architecture``: one Hugging Face architecture glassbox converts to and from.

Each family module (``gpt2.py``, ``llama.py``, ...) lists its entries in ``FAMILIES``;
``architectures.py`` collects them. An entry names the ``transformers`` config and model classes,
the four pure converter functions, and what ``checks.py`` verifies in a folder before building:
``config_fields`` (config.json field -> kind) and ``weight_layout`` (the layer-count field, a pattern
whose group is a layer index, and [(embedding tensor names, (config field of each axis))]) and
``tied_names``: (the embedding's names in a checkpoint, the unembedding's), for ``resolve_tying``.

``resolve_tying`` is transformers 5's rule for a config that ties the embeddings (its
``tie_weights`` during ``from_pretrained``), applied to the tensors before a converter reads them:
- no unembedding tensor: tied (W_U is W_E);
- an unembedding equal to the embedding (``torch.equal``; a .bin checkpoint stores both): tied;
- an unembedding that differs (values or shape): NOT tied. transformers logs that it keeps both and
  its logits use the unembedding, so the Config becomes ``tied_unembed=False``;
- an unembedding and no embedding: the embedding is the unembedding (transformers ties the missing
  one to the one present).
The same rule reads an in-memory transformers model (``from_hf``): a model that kept both has two
different tensors in its state dict, a tied one the same tensor twice.
"""

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hf_config_class: str  # a name in the transformers package
    hf_model_class: str
    config_from: Callable  # HF config -> Config
    to_glassbox: Callable  # (HF state dict, Config, source) -> our state dict
    config_to: Callable  # Config -> HF config (ValueError when it cannot represent it)
    to_hf: Callable  # (our state dict, Config) -> HF state dict
    config_fields: dict = field(default_factory=dict)
    weight_layout: Optional[tuple] = None
    tied_names: tuple = (("model.embed_tokens.weight",), ("lm_head.weight",))


def resolve_tying(cfg, state: Mapping, tied_names: tuple) -> tuple:
    """(cfg, state) with transformers' tying rule applied (module docstring): ``cfg.tied_unembed``
    becomes False where the checkpoint's unembedding differs from its embedding, and a missing
    embedding is filled from the unembedding. ``state`` is not modified (a new dict where it changes)."""
    if not cfg.tied_unembed:
        return cfg, state
    embeddings, heads = tied_names
    head = next((name for name in heads if name in state), None)
    if head is None:
        return cfg, state
    embedding = next((name for name in embeddings if name in state), None)
    if embedding is None:
        return cfg, {**state, embeddings[0]: state[head]}
    if not _equal(state[embedding], state[head]):
        return cfg.replace(tied_unembed=False), state
    return cfg, state


def _equal(a, b) -> bool:
    """transformers compares the two in the dtype it loads both into; compared here in the wider of
    their stored dtypes, which casting to any one load dtype cannot make unequal."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    if a.dtype != b.dtype:
        wide = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(wide), b.to(wide)
    return torch.equal(a, b.to(a.device))


# The Config options of today's families, at the values that mean "GPT-2's behaviour". An exporter
# that does not map one refuses a config that sets it (``options_beyond``), rather than writing a
# Hugging Face config that computes something else.
FAMILY_OPTION_DEFAULTS = {
    "ungroup_grouped_query_attention": False, "attn_scale": None, "scale_attn_by_inverse_layer_idx": False,
    "upcast_attn": False, "qk_norm": None, "attn_scores_soft_cap": None, "output_logits_soft_cap": None,
    "attn_types": None, "window_size": None, "rotary_base_local": None, "rope_scaling": None,
    "norm_weight_offset": 0.0, "scale_embed": False, "parallel_ln2": False,
}


def options_beyond(cfg, allowed=()) -> dict:
    """The family options ``cfg`` sets (away from GPT-2's behaviour) that are not in ``allowed``:
    the FAMILY_OPTION_DEFAULTS fields, grouped-query attention (n_key_value_heads != n_heads) and
    per-part biases that differ from use_bias. ``ungroup_grouped_query_attention`` only changes hook
    shapes, so it never blocks an export."""
    found = {name: getattr(cfg, name) for name, default in FAMILY_OPTION_DEFAULTS.items()
             if name not in allowed and name != "ungroup_grouped_query_attention" and getattr(cfg, name) != default}
    if "n_key_value_heads" not in allowed and cfg.n_key_value_heads != cfg.n_heads:
        found["n_key_value_heads"] = cfg.n_key_value_heads
    for name in ("qkv_bias", "attn_out_bias", "mlp_bias"):
        if name not in allowed and getattr(cfg, name) != cfg.use_bias:
            found[name] = getattr(cfg, name)
    return found


def check_hf_activation(act, family: str) -> None:
    """Refuse a Hugging Face ``activation_function`` glassbox's MLP does not compute (one it has no
    function for, or one with learned parameters), naming the family and the names it accepts."""
    from ..models.activations import ACTIVATIONS, PARAMETRISED_ACTIVATIONS

    if act in PARAMETRISED_ACTIVATIONS or act not in ACTIVATIONS:
        from ..suggest import did_you_mean

        raise ValueError(f"{family} activation_function {act!r} is not supported (glassbox computes "
                         f"{', '.join(a for a in ACTIVATIONS if a not in PARAMETRISED_ACTIVATIONS)})"
                         + did_you_mean(act, ACTIVATIONS))
