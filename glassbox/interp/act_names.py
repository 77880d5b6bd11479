"""act_name: TransformerLens's activation shorthand, resolved by one exact table (no regex).

``act_name("pattern", 3)`` -> ``"blocks.3.attn.hook_pattern"``; ``act_name("q", 2, "attn")`` checks
that q lives in attn; ``act_name("scale", 1, "ln2")`` -> ``"blocks.1.ln2.hook_scale"``;
``act_name("scale")`` -> ``"ln_final.hook_scale"``. ``split_compact`` reads TransformerLens's compact
strings ("k6" is ("k", 6), "scale4ln1" is ("scale", 4, "ln1")) by plain parsing. A kind ending in
``_grad`` names the gradient entry of a cache (``"resid_pre_grad", 0`` -> ``"blocks.0.hook_resid_pre_grad"``).

Footgun: the name is built whether or not the model has that hook; the cache lookup is what fails,
naming the closest cached keys.
"""

from typing import Optional

from ..suggest import close_names

# kind -> (module inside a block, "" for the block itself; or None for a model-level hook)
BLOCK_KINDS = {
    "resid_pre": "", "attn_out": "", "resid_mid": "", "mlp_out": "", "resid_post": "",
    "attn_in": "", "q_input": "", "k_input": "", "v_input": "", "mlp_in": "",  # under the hook flags
    "q": "attn", "k": "attn", "v": "attn", "rot_q": "attn", "rot_k": "attn",
    "attn_scores": "attn", "pattern": "attn", "z": "attn", "result": "attn",
    "pre": "mlp", "post": "mlp", "pre_linear": "mlp",
}
MODEL_KINDS = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
NORM_KINDS = ("scale", "normalized")  # live in ln1, ln2 (with a layer) or ln_final (without)
NORM_MODULES = ("ln1", "ln2", "ln_final")

# TransformerLens's aliases, so ported notebooks resolve to the same names.
KIND_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                "mlp_pre": "pre", "mlp_post": "post"}
MODULE_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": "", "block": "", "blocks": ""}


def act_name(kind: str, layer: Optional[int] = None, layer_type: Optional[str] = None) -> str:
    """The full hook name for a TransformerLens shorthand; ``KeyError`` naming what is wrong."""
    if not isinstance(kind, str):
        raise KeyError(f"activation kind must be a string, got {kind!r}")
    if kind.endswith("_grad"):
        return act_name(kind[: -len("_grad")], layer, layer_type) + "_grad"
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise KeyError(f"layer must be an int, got {layer!r} (for {kind!r})")
    kind = KIND_ALIASES.get(kind, kind)
    module = MODULE_ALIASES.get(layer_type, layer_type) if layer_type is not None else None
    if kind in MODEL_KINDS:
        if layer is not None or module is not None:
            raise KeyError(f"{kind!r} is not per layer; use act_name({kind!r}) with no layer")
        return MODEL_KINDS[kind]
    if kind in NORM_KINDS:
        return _norm_name(kind, layer, module)
    if kind not in BLOCK_KINDS:
        known = sorted([*BLOCK_KINDS, *MODEL_KINDS, *NORM_KINDS, *KIND_ALIASES])
        close = close_names(kind, known, cutoff=0.5)
        hint = f"closest: {', '.join(close)}; " if close else ""
        raise KeyError(f"unknown activation kind {kind!r}; {hint}known kinds: {', '.join(known)}")
    if layer is None:
        raise KeyError(f"{kind!r} is per layer: give a layer, e.g. ({kind!r}, 0)")
    expected = BLOCK_KINDS[kind]
    if module is not None and module != expected:
        raise KeyError(f"{kind!r} lives in {expected or 'the block'!r}, not {layer_type!r}")
    return f"blocks.{layer}.{expected + '.' if expected else ''}hook_{kind}"


def _norm_name(kind: str, layer: Optional[int], module: Optional[str]) -> str:
    if module is None:
        module = "ln_final" if layer is None else None
    if module not in NORM_MODULES:
        raise KeyError(f"{kind!r} needs its norm: layer_type one of ln1, ln2 (with a layer) or ln_final "
                       f"(without), got layer={layer!r}, layer_type={module!r}")
    if module == "ln_final":
        if layer is not None:
            raise KeyError(f"ln_final is not per layer; use ({kind!r},) or ({kind!r}, None, 'ln_final')")
        return f"ln_final.hook_{kind}"
    if layer is None:
        raise KeyError(f"{module}.{kind} is per layer: give a layer, e.g. ({kind!r}, 0, {module!r})")
    return f"blocks.{layer}.{module}.hook_{kind}"


def split_compact(name: str) -> Optional[tuple]:
    """("k", 6, None) for "k6", ("scale", 4, "ln1") for "scale4ln1": lowercase letters, a layer number,
    then the module; None for anything else (a full name, a name with no layer number)."""
    letters = len(name) - len(name.lstrip("abcdefghijklmnopqrstuvwxyz"))
    digits = len(name[letters:]) - len(name[letters:].lstrip("0123456789"))
    if not letters or not digits:
        return None
    rest = name[letters + digits:]
    return name[:letters], int(name[letters:letters + digits]), rest or None
