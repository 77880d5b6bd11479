"""Checks of a model folder before anything is built: the config's fields, then the config against
the weights' own header.

``check_config_fields``: every field glassbox reads from config.json has the right JSON type (sizes
positive integers, rates finite numbers, flags booleans, names strings), so a wrong type is an error
naming the file and the field, not a TypeError from deep inside ``transformers`` or the model.

``check_against_weights``: the config's layer count and embedding sizes match the tensors the
weights hold (names and shapes from the safetensors header, so no tensor is read). A config claiming
10**6 layers over 2 layers of weights is refused at once, naming the field and what the weights
hold, instead of after building bookkeeping for a million layers.
"""

import math
import re
from typing import Mapping

# Field kinds: "size" (positive int), "count" (int >= 0), "number" (finite, > 0), "number>=0", "str",
# "bool", "object"; a kind ending in "?" also takes null.
CONFIG_FIELDS = {
    "gpt2": {"n_layer": "size", "n_embd": "size", "n_head": "size", "vocab_size": "size", "n_positions": "size",
             "n_inner": "size?", "activation_function": "str", "layer_norm_epsilon": "number",
             "initializer_range": "number>=0", "tie_word_embeddings": "bool", "scale_attn_weights": "bool",
             "scale_attn_by_inverse_layer_idx": "bool", "reorder_and_upcast_attn": "bool"},
    "llama": {"num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size",
              "num_key_value_heads": "size?", "vocab_size": "size", "max_position_embeddings": "size",
              "intermediate_size": "size", "head_dim": "size?", "hidden_act": "str", "rms_norm_eps": "number",
              "initializer_range": "number>=0", "rope_theta": "number", "tie_word_embeddings": "bool",
              "attention_bias": "bool", "mlp_bias": "bool", "rope_parameters": "object?", "rope_scaling": "object?",
              "sliding_window": "size?"},
    "mistral": {"num_hidden_layers": "size", "hidden_size": "size", "num_attention_heads": "size",
                "num_key_value_heads": "size?", "vocab_size": "size", "max_position_embeddings": "size",
                "intermediate_size": "size", "head_dim": "size?", "hidden_act": "str", "rms_norm_eps": "number",
                "initializer_range": "number>=0", "rope_theta": "number", "tie_word_embeddings": "bool",
                "rope_parameters": "object?", "rope_scaling": "object?", "sliding_window": "size?"},
    "gptj": {"n_layer": "size", "n_embd": "size", "n_head": "size", "vocab_size": "size", "n_positions": "size",
             "n_inner": "size?", "rotary_dim": "size?", "activation_function": "str",
             "layer_norm_epsilon": "number", "initializer_range": "number>=0", "tie_word_embeddings": "bool"},
}

# model_type -> (config field of the layer count, pattern whose group is a layer index,
#                [(embedding-like tensor names, (config field of each axis))]).
WEIGHT_LAYOUT = {
    "gpt2": ("n_layer", r"(?:transformer\.)?h\.(\d+)\.",
             [(("transformer.wte.weight", "wte.weight"), ("vocab_size", "n_embd")),
              (("transformer.wpe.weight", "wpe.weight"), ("n_positions", "n_embd"))]),
    "llama": ("num_hidden_layers", r"model\.layers\.(\d+)\.",
              [(("model.embed_tokens.weight",), ("vocab_size", "hidden_size"))]),
    "mistral": ("num_hidden_layers", r"model\.layers\.(\d+)\.",
                [(("model.embed_tokens.weight",), ("vocab_size", "hidden_size"))]),
    "gptj": ("n_layer", r"transformer\.h\.(\d+)\.",
             [(("transformer.wte.weight",), ("vocab_size", "n_embd"))]),
}

BASE_KIND_TEXT = {"size": "a positive integer", "count": "an integer >= 0", "number": "a finite number > 0",
                  "number>=0": "a finite number >= 0", "str": "a string", "bool": "true or false",
                  "object": "a JSON object"}


def kind_text(kind: str) -> str:
    """What a field of ``kind`` must be, in words (a kind ending in "?" also takes null)."""
    base = kind.rstrip("?")
    if base not in BASE_KIND_TEXT:
        raise ValueError(f"unknown config field kind {kind!r}")
    return BASE_KIND_TEXT[base] + (" or null" if kind.endswith("?") else "")


def check_config_fields(config: dict, fields: Mapping[str, str], source: str, prefix: str = "") -> None:
    """Each field of ``config`` (a parsed config.json) named in ``fields`` (field -> kind, or field ->
    the fields of a nested object, such as an image-text model's text_config) has its kind;
    ValueError naming it (a nested one as "text_config.rms_norm_eps")."""
    for field, kind in fields.items():
        if field not in config:
            continue
        if isinstance(kind, Mapping):
            if not isinstance(config[field], dict):
                raise ValueError(f"{source}: field {prefix + field!r} must be a JSON object, got "
                                 f"{_short(config[field])} ({type(config[field]).__name__})")
            check_config_fields(config[field], kind, source, prefix=f"{prefix}{field}.")
        elif not _is_kind(config[field], kind):
            raise ValueError(f"{source}: field {prefix + field!r} must be {kind_text(kind)}, got "
                             f"{_short(config[field])} ({type(config[field]).__name__})")


def _is_kind(value, kind: str) -> bool:
    if kind.endswith("?") and value is None:
        return True
    kind = kind.rstrip("?")
    if kind in ("size", "count"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= (1 if kind == "size" else 0)
    if kind in ("number", "number>=0"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return value > 0 if kind == "number" else value >= 0
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    raise ValueError(f"unknown config field kind {kind!r}")


# Numbers inside rope_parameters (and the old rope_scaling) that the converters read directly; the
# scaling parameters (factor, beta_fast, ...) are checked where they are read (models/positional.py).
ROPE_NUMBERS = {"rope_theta": "number?", "partial_rotary_factor": "number?"}


def check_rope_fields(config: dict, source: str) -> None:
    """rope_parameters / rope_scaling's rope_theta and partial_rotary_factor are finite numbers > 0
    (partial_rotary_factor at most 1), also inside Gemma 3's per-layer-type dicts; ValueError naming
    the field and the value."""
    for field in ("rope_parameters", "rope_scaling"):
        value = config.get(field)
        if not isinstance(value, dict):
            continue
        nested = [(f"{field}.{k}", v) for k, v in value.items() if isinstance(v, dict)]
        for where, params in [(field, value)] + nested:
            for key, kind in ROPE_NUMBERS.items():
                number = params.get(key)
                if key in params and (not _is_kind(number, kind) or (key == "partial_rotary_factor" and number is not None and number > 1)):
                    limit = " and at most 1" if key == "partial_rotary_factor" else ""
                    raise ValueError(f"{source}: field {where}.{key} must be {kind_text(kind)}{limit}, got "
                                     f"{_short(number)} ({type(number).__name__})")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_against_weights(hf_config, layout, shapes: Mapping[str, tuple], config_source: str,
                          weights_source: str) -> None:
    """The config's layer count and embedding sizes agree with the weights' tensor names and shapes
    (``layout``: an Architecture's ``weight_layout``; None checks nothing)."""
    if layout is None:
        return
    layer_field, pattern, embeddings = layout
    claimed = getattr(hf_config, layer_field)
    found = sorted({int(m.group(1)) for m in map(re.compile(pattern).match, shapes) if m})
    if len(found) != claimed or found != list(range(len(found))):  # never a list of the claimed size
        held = (f"weights for {len(found)} layer(s)" + (f" (indices {found[0]}..{found[-1]})" if found else "")
                if found else "no layer weights")
        raise ValueError(f"{config_source}: {layer_field}={claimed}, but {weights_source} holds {held}: the "
                         "config does not describe these weights")
    for names, fields in embeddings:
        name = next((n for n in names if n in shapes), None)
        if name is None:
            continue  # a missing tensor is named by the converter's own check
        shape = tuple(shapes[name])
        claimed = tuple(getattr(hf_config, f) for f in fields)
        if shape != claimed:
            wrong = next((i for i, (a, b) in enumerate(zip(claimed, shape + (None,) * len(claimed))) if a != b), 0)
            raise ValueError(f"{config_source}: {fields[wrong]}={claimed[wrong]}, but {weights_source} holds "
                             f"{name} of shape {shape} ({', '.join(fields)} = {shape})")
