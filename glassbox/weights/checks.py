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

from ..hooks.errors import KeysError

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


def check_state_dict(state_dict, expected: Mapping[str, tuple], source: str = "state_dict",
                     renamed: Mapping[str, str] = None, exempt: tuple = ()) -> None:
    """A state dict to load: a mapping of exactly ``expected``'s keys (name -> shape) to finite floating
    tensors of those shapes. ``renamed`` maps a key of ``state_dict`` to the name it was given by the
    caller (TransformerLens's ``unembed.W_U`` for glassbox's ``unembed.W_U_T``), so errors name what
    the caller passed, with the shape the caller's layout needs. Keys in ``exempt`` may be unexpected
    (a later check refuses them with its own reason).

    Raises TypeError (not a mapping, a value not a tensor), KeysError (a KeyError and ValueError: missing or
    unexpected keys, the closest names given) or ValueError (a shape, a non-floating dtype, nan or inf), naming the key.
    """
    import difflib

    import torch

    renamed = renamed or {}
    name = lambda key: renamed.get(key, key)  # noqa: E731
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{source} must be a mapping of parameter name to tensor, got {type(state_dict).__name__}")
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected and k not in exempt]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(name(k) for k in missing[:5])}" + ("..." if len(missing) > 5 else ""))
        for key in unexpected[:5]:
            close = difflib.get_close_matches(key, list(expected), n=1)
            parts.append(f"unexpected {name(key)}" + (f" (closest: {name(close[0])})" if close else ""))
        raise KeysError(f"{source}: {'; '.join(parts)}")
    for key, value in state_dict.items():
        if key not in expected:
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{source}[{name(key)!r}] must be a tensor, got {type(value).__name__}")
        want = tuple(expected[key])
        if key in renamed and len(want) == 2:  # the caller's layout is the transpose (W_U of W_U_T)
            got, want = tuple(value.shape)[::-1], want[::-1]
        else:
            got = tuple(value.shape)
        if got != want:
            raise ValueError(f"{source}[{name(key)!r}] has shape {got}; this model needs {want}")
        if not value.is_floating_point():
            raise ValueError(f"{source}[{name(key)!r}] is {value.dtype}; weights are floating tensors")
        if value.numel() and not bool(torch.isfinite(value).all()):
            bad = "nan" if bool(value.isnan().any()) else "inf"
            raise ValueError(f"{source}[{name(key)!r}] holds {bad}; refusing to load (and fold) non-finite weights")
