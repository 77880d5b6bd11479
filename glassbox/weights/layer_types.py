"""Which layers slide: one reading of a config's ``layer_types`` (and its window) for every family.

What transformers 5.24 computes, and so what glassbox does:
- Qwen2/3, Gemma 2/3 and Ministral read ``layer_types`` layer by layer: a "sliding_attention" layer
  attends to the keys less than ``sliding_window`` positions back (``attn_types`` "local"), a
  "full_attention" layer to every key ("global"). Where the list is absent their configs derive it
  (Qwen: ``use_sliding_window``, ``sliding_window``, ``max_window_layers``; Gemma 2: alternating;
  Gemma 3: ``sliding_window_pattern``; Ministral: every layer slides when sliding_window is set).
- A Mistral config.json with ``layer_types`` is a Ministral model: transformers' AutoConfig reads it
  so ("treating as ministral"), and so does ``from_pretrained`` here (``MISTRAL_WITH_LAYER_TYPES``).
- Every other model class never reads ``layer_types``: its forward treats every layer alike (Mistral:
  every layer windowed when sliding_window is set; the rest: none), while its generation cache
  (``DynamicCache(config)``) slides each "sliding_attention" layer, or fails to. So a list that agrees
  with the forward, or (Mistral) one of all "full_attention" under a window, which both paths window,
  loads as the forward computes it; any other is refused naming the field.
- The old name "attention" means "full_attention" (transformers remaps it). Entries glassbox does not
  compute ("chunked_attention", ...), a list of the wrong length, and sliding layers without a
  ``sliding_window`` are refused naming ``layer_types``.
"""

from typing import Optional

LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local"}
LEGACY_NAMES = {"attention": "full_attention"}
# model_type that reads layer_types layer by layer
READS_LAYER_TYPES = ("qwen2", "qwen3", "gemma2", "gemma3_text", "ministral")
MISTRAL_WITH_LAYER_TYPES = "ministral"  # the model_type transformers' AutoConfig gives it


def layer_types_of(hf_config, family: str) -> Optional[list]:
    """The config's layer_types, checked (None when it has none): a list of known names, one per layer."""
    types = getattr(hf_config, "layer_types", None)
    if types is None:
        return None
    n = hf_config.num_hidden_layers
    if not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
        raise ValueError(f"{family} layer_types={types!r} must be a list of layer type names, one per layer")
    types = [LEGACY_NAMES.get(t, t) for t in types]
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"{family} layer_types={types} has {unknown}: glassbox computes {', '.join(LAYER_TYPES)}")
    if len(types) != n:
        raise ValueError(f"{family} layer_types has {len(types)} entries for num_hidden_layers={n}")
    return types


def attn_types_from(hf_config, family: str, model_type: str, windowed: bool = False) -> tuple:
    """(Config.attn_types, Config.window_size) of a config: (None, None) when no layer slides.

    ``windowed``: for a family that does not read layer_types, whether its forward windows every layer
    (Mistral with a sliding_window)."""
    types = layer_types_of(hf_config, family)
    window = getattr(hf_config, "sliding_window", None)
    if model_type not in READS_LAYER_TYPES:
        forward = "sliding_attention" if windowed else "full_attention"
        if types is not None and any(t != forward for t in types) and not (windowed and set(types) == {"full_attention"}):
            does = (f"windows every layer by sliding_window={window}" if windowed
                    else "attends to every position in every layer")
            raise ValueError(
                f"{family} layer_types={types}: transformers' {family} model does not read layer_types (its forward "
                f"{does}) but its generation cache slides each sliding_attention layer (or fails), so transformers "
                "computes two different models; remove layer_types (or give every layer the same type)"
                + (f", or set model_type 'ministral' for per-layer windows" if family == "Mistral" else ""))
        types = [forward] * hf_config.num_hidden_layers
    if types is None or "sliding_attention" not in types:
        return None, None
    if window is None:
        raise ValueError(f"{family} layer_types={types} has sliding_attention layers but sliding_window is None"
                         + (f" (use_sliding_window={hf_config.use_sliding_window})"
                            if hasattr(hf_config, "use_sliding_window") else "") + ": no window to apply")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{family} sliding_window={window!r} must be None or a positive integer")
    return tuple(LAYER_TYPES[t] for t in types), window
