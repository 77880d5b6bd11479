"""HookedTransformerConfig: TransformerLens 3.x's config object, as a view of a glassbox ``Config``.

``HookedTransformerConfig(**tl_kwargs)`` takes every field of TransformerLens 3.9's dataclass, with its
defaults (``act_fn="relu"``, ``positional_embedding_type="standard"``, ``d_head`` required, ``n_heads``
derived as ``d_model // d_head``...), and builds the glassbox ``Config`` that computes the same model
(``cfg.glassbox``). Today's families map onto glassbox's options where the meaning is the same
(``family_options``; the list is in ``fields.py``): grouped-query heads, q/k norms, the score divisor,
soft caps, local layers, norms after the sublayers, OLMo's output norms, rope scaling. Options glassbox
cannot compute (shortformer or alibi positions, Qwen-1's dynamic NTK, mixture-of-experts, a final
RMSNorm under LayerNorm blocks, ...) are refused with a ``ValueError`` naming the field and value; an
unknown field is a ``TypeError``, as for the dataclass.

Fields both configs name but read differently hold TransformerLens's value here (``n_key_value_heads``
None without grouping, ``attn_scale`` the divisor, soft caps -1.0 when off); glassbox's derived values
(``n_kv_groups``, ``layer_attn_type``, ``layer_attn_scale``) and ``cfg.glassbox`` give glassbox's.
TransformerLens's parallel block reads its own ln2 (GPT-NeoX's), so ``parallel_attn_mlp`` builds
glassbox's parallel block with ``parallel_ln2``.

Reading: every TransformerLens field (``cfg.d_vocab_out``, ``cfg.n_params``, ``cfg.attn_scale``...),
and every glassbox field and method (``cfg.normalization``, ``cfg.positional``, ``cfg.replace``): the
class subclasses glassbox's ``Config`` and carries copies of ``cfg.glassbox``'s fields, so glassbox
code handed this object (typed ``cfg: Config``) keeps working; ``cfg.replace(...)`` returns a plain
glassbox Config. Fields both share (``act_fn``, ``d_mlp``, ``default_prepend_bos``, ``model_name``...)
hold TransformerLens's value. ``to_dict()`` is TransformerLens's (its field names):
``HookedTransformerConfig(**cfg.to_dict())`` rebuilds it; ``dataclasses.asdict(cfg)`` gives glassbox's
fields, and ``dataclasses.replace(cfg, ...)`` does not work (use ``cfg.replace``).

Writing, once the config belongs to a model (``model.cfg``): the four hook flags write through to
``model.hook_flags`` (``cfg.use_attn_result = True`` is ``model.set_use_attn_result(True)``);
``default_prepend_bos`` and the descriptive fields (``model_name``, ``tokenizer_name``, ``seed``,
checkpoint labels...) are stored; ``device`` and ``dtype`` follow the model's parameters (change them
with ``model.to``); a field that shapes the computation (``n_layers``, ``act_fn``...) raises
``AttributeError``: it needs a new model. On a config not yet given to a model every field can be set,
and the glassbox Config is rebuilt (and validated) at once; a refused value leaves it unchanged.

Footgun: ``copy.deepcopy(model.cfg)`` is a free-standing config (flags, device and dtype as they were),
not tied to the model; deep-copying the model copies its config with it.
"""

import copy
import dataclasses
import pprint
import random
from typing import Any, Dict

import numpy as np
import torch

from ...models import Config
from ...models.config import ACT_FNS
from .fields import (DESCRIPTIVE, FLAGS, FULL_QK_NORM_ARCHITECTURES, REFUSED, TL_DEFAULTS, family_fields,
                     family_options, rope_scaling, scales_local_layers)

POSITIONAL_TO_GLASSBOX = {"standard": "learned", "rotary": "rotary"}
POSITIONAL_FROM_GLASSBOX = {"learned": "standard", "rotary": "rotary", "sinusoidal": "sinusoidal"}
# TransformerLens's activations followed by a LayerNorm over d_mlp (its is_layer_norm_activation):
# glassbox's activation of that name, with Config.mlp_ln.
NORMED_ACT_FNS = {"solu_ln": "solu"}
NORMED_ACT_FN_OF = {v: k for k, v in NORMED_ACT_FNS.items()}
# TransformerLens names a norm whose weights were folded away "...Pre"; glassbox keeps it, at w=1 and b=0.
NORMALIZATIONS = {"LN": "LN", "LNPre": "LN", "RMS": "RMS", "RMSPre": "RMS"}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _refuse(name: str, value, why: str):
    raise ValueError(f"HookedTransformerConfig.{name}={value!r} is not supported: {why}")


def check(values: Dict[str, Any]) -> None:
    """Refuse, naming the field and value, every TransformerLens option glassbox does not compute."""
    for name, (allowed, why) in REFUSED.items():
        if values[name] != TL_DEFAULTS[name] and not allowed(values[name], values):
            _refuse(name, values[name], why)
    positional = values["positional_embedding_type"]
    if positional not in POSITIONAL_TO_GLASSBOX:
        _refuse("positional_embedding_type", positional, "glassbox computes 'standard' (learned) and 'rotary' "
                "positions; shortformer, alibi and relative position biases are not implemented")
    norm = values["normalization_type"]
    if norm not in NORMALIZATIONS:
        _refuse("normalization_type", norm, "glassbox builds 'LN' or 'RMS' ('LNPre'/'RMSPre': the same norm with "
                "w = 1 and b = 0); a model without norms is not implemented")
    if values["act_fn"] not in ACT_FNS + tuple(NORMED_ACT_FNS) and not values["attn_only"]:
        _refuse("act_fn", values["act_fn"], f"glassbox's activations are {', '.join(ACT_FNS + tuple(NORMED_ACT_FNS))}")
    if values["act_fn"] in NORMED_ACT_FNS and values["gated_mlp"] and not values["attn_only"]:
        _refuse("act_fn", values["act_fn"], "glassbox's norm after the activation (mlp_ln) is built in plain MLPs, "
                "not gated ones")
    if values["init_mode"] != "gpt2":
        _refuse("init_mode", values["init_mode"], "glassbox initialises the 'gpt2' way (normal weights) only")
    if values["d_vocab_out"] not in (-1, values["d_vocab"]):
        _refuse("d_vocab_out", values["d_vocab_out"], f"glassbox's unembedding maps to d_vocab={values['d_vocab']}")
    if values["use_attn_scale"] and not (isinstance(values["attn_scale"], (int, float)) and values["attn_scale"] > 0):
        _refuse("attn_scale", values["attn_scale"], "the scores are divided by attn_scale, which must be a number > 0")
    architecture = values["original_architecture"]
    if architecture in FULL_QK_NORM_ARCHITECTURES and not values["normalization_type"] in ("RMS", "RMSPre"):
        _refuse("original_architecture", architecture, "TransformerLens gives it q/k RMSNorms over all heads, which "
                "glassbox builds only in RMS models (normalization_type 'RMS' or 'RMSPre')")
    local = values["use_local_attn"] and "local" in values["attn_types"]
    if local and rope_scaling(values) is not None and scales_local_layers(values):
        base = values["rotary_base_local"]
        if base is not None and base != values["rotary_base"]:
            _refuse("rotary_base_local", base, "TransformerLens rescales the local layers' rotary frequencies with "
                    "their own base here (NTK-by-parts, or YaRN without yarn_global_attn_only); glassbox's local "
                    "layers with their own base are never rescaled")


def to_glassbox(values: Dict[str, Any]) -> Config:
    """The glassbox Config computing what TransformerLens builds from ``values`` (TL field names)."""
    check(values)
    positional, norm = values["positional_embedding_type"], values["normalization_type"]
    # An attention-only model has no MLP, so its act_fn is unused.
    act_fn = values["act_fn"] if values["act_fn"] in ACT_FNS else "gelu_new"
    extra = {}
    if values["act_fn"] in NORMED_ACT_FNS and not values["attn_only"]:  # "solu_ln": SoLU, then a norm over d_mlp
        act_fn = NORMED_ACT_FNS[values["act_fn"]]
        extra = {"mlp_ln": True}
    if values["d_vocab"] in (-1, None):
        raise ValueError("HookedTransformerConfig.d_vocab is not set: give d_vocab, or a tokenizer to the model")
    extra = {"attn_only": True} if values["attn_only"] else extra
    rotary = positional == "rotary"
    try:
        return _config(values, act_fn, norm, positional, rotary, extra)
    except ValueError as err:  # a combination the glassbox Config cannot build, named by its own field
        raise ValueError(f"HookedTransformerConfig: these fields give a model glassbox cannot build: {err}") from None


def _config(values, act_fn, norm, positional, rotary, extra) -> Config:
    return Config(
        d_model=values["d_model"], n_layers=values["n_layers"], n_heads=values["n_heads"], d_vocab=values["d_vocab"],
        n_ctx=values["n_ctx"], d_head=values["d_head"], d_mlp=values["d_mlp"], act_fn=act_fn,
        gated_mlp=values["gated_mlp"], layer_norm_eps=float(values["eps"]), init_range=float(values["initializer_range"]),
        normalization=NORMALIZATIONS[norm], parallel_attn_mlp=values["parallel_attn_mlp"],
        positional=POSITIONAL_TO_GLASSBOX[positional], rotary_dim=values["rotary_dim"] if rotary else None,
        rotary_base=float(values["rotary_base"]),
        rotary_style="interleaved" if values["rotary_adjacent_pairs"] else "half",
        # TransformerLens's HookedTransformer has every bias and a separate W_U with b_U.
        use_bias=True, tied_unembed=False, unembed_bias=True, init_scheme="gpt2",
        default_prepend_bos=values["default_prepend_bos"], model_name=values["model_name"], **extra,
        # TransformerLens's GatedMLP has no b_gate and adds b_in to the gated product
        gated_mlp_bias="product" if values["gated_mlp"] else "inputs",
        **family_options(values))


def from_glassbox(cfg: Config) -> Dict[str, Any]:
    """The TransformerLens fields of a glassbox Config (those it determines)."""
    return dict(
        d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx, n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab, eps=cfg.layer_norm_eps,
        act_fn=NORMED_ACT_FN_OF.get(cfg.act_fn, cfg.act_fn + "_ln") if getattr(cfg, "mlp_ln", False) else cfg.act_fn,
        normalization_type=cfg.normalization, positional_embedding_type=POSITIONAL_FROM_GLASSBOX[cfg.positional],
        rotary_dim=cfg.rotary_dim, rotary_base=cfg.rotary_base, rotary_adjacent_pairs=cfg.rotary_style == "interleaved",
        parallel_attn_mlp=cfg.parallel_attn_mlp, gated_mlp=cfg.gated_mlp, attn_only=getattr(cfg, "attn_only", False),
        initializer_range=cfg.init_range, init_mode="gpt2", model_name=cfg.model_name,
        default_prepend_bos=cfg.default_prepend_bos, uses_rms_norm=cfg.normalization == "RMS",
        **family_fields(cfg))


def derive(values: Dict[str, Any], checked: bool = True) -> Dict[str, Any]:
    """TransformerLens's __post_init__: sizes, scales and parameter count derived from the given fields;
    then (``checked``) the refusals of ``check``."""
    v = dict(values)
    if v["d_head"] is None or v["d_head"] <= 0:
        raise ValueError(f"HookedTransformerConfig.d_head must be a positive int, got {v['d_head']!r}")
    if v["n_heads"] == -1:
        if v["d_model"] % v["d_head"]:
            raise ValueError(f"HookedTransformerConfig: d_model={v['d_model']} is not divisible by d_head={v['d_head']}")
        v["n_heads"] = v["d_model"] // v["d_head"]
    if v["d_mlp"] is None:
        v["d_mlp"] = 4 * v["d_model"]
    if v["initializer_range"] < 0:
        v["initializer_range"] = 0.8 / np.sqrt(v["d_model"]) if v["init_mode"] == "gpt2" else 1.0
    if v["d_vocab_out"] == -1:
        v["d_vocab_out"] = v["d_vocab"]
    if v["positional_embedding_type"] == "rotary" and v["rotary_dim"] is None:
        v["rotary_dim"] = v["d_head"]
    n_params = v["n_layers"] * v["d_model"] * v["d_head"] * v["n_heads"] * 4
    if not v["attn_only"]:
        n_params += v["n_layers"] * v["d_model"] * v["d_mlp"] * (2 + bool(v["gated_mlp"]))
    v["n_params"] = n_params
    if v["device"] is None:
        v["device"] = default_device()
    if v["use_attn_scale"] and v["attn_scale"] == -1.0:
        v["attn_scale"] = np.sqrt(v["d_head"])
    if v["default_prepend_bos"] not in (True, False):
        raise ValueError(f"HookedTransformerConfig.default_prepend_bos must be True or False, got "
                         f"{v['default_prepend_bos']!r}")
    if checked:
        check(v)
    return v


GLASSBOX_FIELDS = tuple(f.name for f in dataclasses.fields(Config))


class HookedTransformerConfig(Config):
    """TransformerLens's config fields over a glassbox ``Config`` (see the module docstring).

    A subclass of ``Config``, so glassbox functions typed ``cfg: Config`` accept it; its Config fields
    are copies of ``cfg.glassbox``'s (those TransformerLens shares, such as ``act_fn`` or
    ``default_prepend_bos``, hold TransformerLens's value). ``replace`` returns a plain glassbox Config.
    """

    def __init__(self, *args, **kwargs):
        names = list(TL_DEFAULTS)
        if len(args) > len(names):
            raise TypeError(f"HookedTransformerConfig takes at most {len(names)} positional arguments")
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in TL_DEFAULTS:
                raise TypeError(f"HookedTransformerConfig got an unexpected keyword argument {name!r}")
            if name in given:
                raise TypeError(f"HookedTransformerConfig got multiple values for argument {name!r}")
            given[name] = value
        missing = [n for n in ("d_model", "d_head", "n_layers", "n_ctx") if n not in given]
        if missing:
            raise TypeError(f"HookedTransformerConfig is missing required argument(s): {', '.join(missing)}")
        values = {**{k: copy.copy(v) for k, v in TL_DEFAULTS.items() if v is not _REQUIRED}, **given}
        values = derive(values)
        glassbox = to_glassbox(values) if values["d_vocab"] not in (-1, None) else None
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_glassbox", glassbox)
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_given", set(given) - {"n_params"})
        self._sync()
        if values["seed"] is not None:
            self.set_seed_everywhere(values["seed"])

    # -- construction from glassbox -----------------------------------------------------------
    @classmethod
    def from_glassbox(cls, cfg: Config, **tl_fields) -> "HookedTransformerConfig":
        """The TransformerLens view of a glassbox Config; ``tl_fields`` set the fields it does not fix
        (``normalization_type="LNPre"`` after fold_ln, ``original_architecture``, ``tokenizer_name``...)."""
        self = cls.__new__(cls)
        values = {k: copy.copy(v) for k, v in TL_DEFAULTS.items() if v is not _REQUIRED}
        values.update(from_glassbox(cfg))
        for name, value in tl_fields.items():
            if name not in TL_DEFAULTS:
                raise TypeError(f"HookedTransformerConfig has no field {name!r}")
            values[name] = value
        # The glassbox Config is valid already; views of glassbox-only options (sinusoidal positions,
        # post-norm blocks) are allowed here, though HookedTransformerConfig(...) cannot build them.
        object.__setattr__(self, "_values", derive(values, checked=False))
        object.__setattr__(self, "_glassbox", cfg)
        object.__setattr__(self, "_model", None)
        object.__setattr__(self, "_given", set(values) - set(_DERIVED))
        self._sync()
        return self

    @classmethod
    def unwrap(cls, config) -> "HookedTransformerConfig":
        """A dict becomes a config; a config is returned as it is."""
        if isinstance(config, dict):
            return cls.from_dict(config)
        if isinstance(config, cls):
            return config
        if isinstance(config, Config):
            return cls.from_glassbox(config)
        raise TypeError(f"expected a HookedTransformerConfig, a dict or a glassbox Config, got {type(config).__name__}")

    @classmethod
    def from_dict(cls, config_dict: Dict[str, Any]) -> "HookedTransformerConfig":
        return cls(**config_dict)

    # -- the glassbox side ---------------------------------------------------------------------
    @property
    def glassbox(self) -> Config:
        """The glassbox Config the model is built from (frozen)."""
        if self._glassbox is None:
            raise ValueError("this HookedTransformerConfig has no d_vocab yet (d_vocab=-1): give d_vocab, or build "
                             "HookedTransformer(cfg, tokenizer=...) to take it from the tokenizer")
        return self._glassbox

    def component_glassbox(self) -> Config:
        """The glassbox Config for one component built standalone (``Attention(cfg)``, ``MLP(cfg)``): the
        model's, or, while d_vocab is not known (-1), the same fields with a placeholder vocabulary,
        which no attention or MLP reads."""
        return self._glassbox if self._glassbox is not None else to_glassbox({**self._values, "d_vocab": 1})

    def _sync(self) -> None:
        """Copy the glassbox Config's fields onto this object (shadowing Config's class defaults)."""
        values = self._values
        glassbox = self._glassbox
        if glassbox is None:  # d_vocab not known yet: the other fields as they will be
            glassbox = to_glassbox({**values, "d_vocab": 1})
        for name in GLASSBOX_FIELDS:
            object.__setattr__(self, name, values[name] if name in values else getattr(glassbox, name))

    def replace(self, **changes) -> Config:
        """A glassbox Config with some fields changed (see ``Config.replace``)."""
        return self.glassbox.replace(**changes)

    # glassbox's derived quantities, from the glassbox Config: fields TransformerLens shares hold its value
    # here (n_key_value_heads None, attn_scale a divisor), not glassbox's
    @property
    def n_kv_groups(self) -> int:
        return self.glassbox.n_kv_groups

    def layer_attn_type(self, layer: int) -> str:
        return self.glassbox.layer_attn_type(layer)

    def layer_attn_scale(self, layer: int) -> float:
        return self.glassbox.layer_attn_scale(layer)

    def _bind(self, model) -> None:
        object.__setattr__(self, "_model", model)

    def _complete(self, d_vocab: int) -> None:
        """Fill in d_vocab (from a tokenizer), as TransformerLens does when the config left it at -1."""
        values = {**self._values, "d_vocab": d_vocab}
        if "d_vocab_out" not in self._given:
            values["d_vocab_out"] = -1
        values = derive(values)
        object.__setattr__(self, "_glassbox", to_glassbox(values))
        object.__setattr__(self, "_values", values)
        self._sync()

    # -- reading -------------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        model = self.__dict__.get("_model")
        if model is not None:
            if name in FLAGS and hasattr(model, "hook_flags"):
                return getattr(model.hook_flags, name)
            if name in ("device", "dtype"):
                first = next(model.parameters(), None)
                if first is not None:
                    return str(first.device) if name == "device" else first.dtype
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        glassbox = self.__dict__.get("_glassbox")
        if glassbox is not None and hasattr(glassbox, name):
            return getattr(glassbox, name)
        raise AttributeError(f"HookedTransformerConfig has no field {name!r} (neither TransformerLens's nor glassbox's)")

    def to_dict(self) -> Dict[str, Any]:
        """TransformerLens's fields and their values (a new dict)."""
        return {name: getattr(self, name) for name in TL_DEFAULTS}

    def __repr__(self) -> str:
        return "HookedTransformerConfig:\n" + pprint.pformat(self.to_dict())

    def __eq__(self, other) -> bool:
        if not isinstance(other, HookedTransformerConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def is_layer_norm_activation(self) -> bool:
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    def set_seed_everywhere(self, seed: int) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)

    # -- writing -------------------------------------------------------------------------------
    def __setattr__(self, name: str, value) -> None:
        if name not in TL_DEFAULTS:
            if name in GLASSBOX_FIELDS:
                raise AttributeError(f"{name!r} is a field of the glassbox Config, which is frozen; set the "
                                     "TransformerLens field instead, or build a new config")
            raise AttributeError(f"HookedTransformerConfig has no field {name!r}")
        model = self._model
        if model is None:
            return self._set_free(name, value)
        if name in FLAGS:
            getattr(model, f"set_{name}")(value)
        elif name in ("device", "dtype"):
            raise AttributeError(f"cfg.{name} follows the model's parameters; use model.to({value!r}) to change it")
        elif name == "original_architecture" and {value, self._values[name]} & set(FULL_QK_NORM_ARCHITECTURES):
            raise AttributeError(f"cfg.original_architecture={value!r}: TransformerLens builds OLMo's norms from it, so "
                                 "it cannot change on a built model; build a new HookedTransformer")
        elif name in DESCRIPTIVE or name == "default_prepend_bos":
            if name == "default_prepend_bos" and value not in (True, False):
                raise ValueError(f"default_prepend_bos must be True or False, got {value!r}")
            self._values[name] = value
            self._sync()
        else:
            raise AttributeError(f"cfg.{name} shapes the model's computation and cannot change on a built model; "
                                 "build a new HookedTransformer from a new HookedTransformerConfig")

    def _set_free(self, name: str, value) -> None:
        given = self._given | {name}
        # Derived fields the user never gave go back to their sentinel and are derived again.
        values = {k: (v if k in given or k not in _DERIVED else TL_DEFAULTS[k]) for k, v in self._values.items()}
        values[name] = value
        values = derive(values)
        glassbox = to_glassbox(values) if values["d_vocab"] not in (-1, None) else None  # raises before any change
        object.__setattr__(self, "_glassbox", glassbox)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_given", given)
        self._sync()

    def __deepcopy__(self, memo):
        new = HookedTransformerConfig.__new__(HookedTransformerConfig)
        memo[id(self)] = new
        model = self._model
        values = copy.deepcopy(self._values, memo)
        if model is not None and id(model) not in memo:  # copied on its own: a snapshot, unbound
            values.update(self.to_dict())
            model = None
        object.__setattr__(new, "_values", values)
        object.__setattr__(new, "_glassbox", self._glassbox)
        object.__setattr__(new, "_model", memo.get(id(model)) if model is not None else None)
        object.__setattr__(new, "_given", set(self._given))
        new._sync()
        return new

    def __copy__(self):
        return self.__deepcopy__({})

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        for key, value in state.items():
            object.__setattr__(self, key, value)


_REQUIRED = TL_DEFAULTS["d_model"]
# Fields derived from others while left at their sentinel (n_params always is).
_DERIVED = ("n_heads", "d_mlp", "initializer_range", "d_vocab_out", "rotary_dim", "n_params", "attn_scale")
