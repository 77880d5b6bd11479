"""TransformerLens's own checkpoint format: the models trained in it and published on the Hugging Face
hub (NeelNanda's SoLU, GELU and attention-only models, e.g. ``NeelNanda/SoLU_1L512W_C4_Code``).

A folder (or hub snapshot) in this format holds a config.json of TransformerLens's fields, no
``model_type`` or ``architectures``, and the weights as a PyTorch state dict in TransformerLens's own
key layout, in a file whose name ends in ``final.pth`` (TransformerLens's rule for the final
checkpoint). ``is_tl_format`` tells such a config apart; ``config_from_tl`` reads exactly the
fields TransformerLens's ``convert_neel_model_config`` reads: d_model, n_layers, d_mlp, d_head,
n_heads, n_ctx, d_vocab, act_fn, attn_only, normalization (or normalization_type), final_rms,
shortformer_pos, tokenizer_name. TransformerLens ignores every other field (its eps is the default
1e-5 whatever ``ln_eps`` says), and so does glassbox. act_fn "solu_ln" is glassbox's "solu" with
``mlp_ln`` (a LayerNorm over d_mlp after it); TransformerLens's "gelu" is the exact erf GELU.
Refused by name: shortformer positions, a final RMSNorm over LayerNorm blocks, normalization other
than "LN"/"RMS", an activation glassbox does not compute, and a missing or mistyped field.

The weights are read with ``torch.load(weights_only=True)`` (``files.read_torch_checkpoint``): a
file that needs more than tensors to unpickle, a truncated or damaged one, or one that is not a flat
dict of tensors is refused naming the file. Keys map one to one onto glassbox's (TransformerLens's
``unembed.W_U`` [d_model d_vocab] is glassbox's ``unembed.W_U_T`` transposed); the causal-mask
buffers TransformerLens saves (``blocks.L.attn.mask``, ``blocks.L.attn.IGNORE``) are dropped, since
glassbox computes the mask. A missing or unexpected key, a wrong shape, a non-floating dtype, NaN or
inf is refused naming the file and the key (``checks.check_state_dict``). Old-format SoLU checkpoints
("neel-solu-old", another key layout) and training checkpoints under ``checkpoints/`` are not read.

Footgun: the tokenizer is not in the model's repo. ``tokenizer_name`` names another repo
(``NeelNanda/gpt-neox-tokenizer-digits``); ``pretrained.load_folder`` loads it from there (the local
cache, else the hub), and a name that resolves nowhere is an error naming it.
"""

from pathlib import Path
from typing import Optional

import torch

from ..models import Config
from .checks import check_state_dict
from .files import is_regular, read_torch_checkpoint

# The checkpoint TransformerLens loads: the repo's file whose name ends so.
FINAL = "final.pth"
INT_FIELDS = ("d_model", "n_layers", "d_mlp", "d_head", "n_heads", "n_ctx", "d_vocab")
ACT_FNS = {"solu_ln": ("solu", True), "gelu": ("gelu", False), "gelu_new": ("gelu_new", False),
           "relu": ("relu", False), "silu": ("silu", False), "solu": ("solu", False)}
BUFFERS = (".attn.mask", ".attn.IGNORE")


def is_tl_format(config: dict) -> bool:
    """A config.json of TransformerLens's own fields (no model_type / architectures, its sizes named
    d_model, n_layers, act_fn)."""
    return ("model_type" not in config and "architectures" not in config
            and all(k in config for k in ("d_model", "n_layers", "act_fn")))


def _field(config: dict, name: str, kind, source: str):
    if name not in config:
        raise ValueError(f"{source}: TransformerLens's field {name!r} is missing")
    value = config[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{source}: {name} must be a positive int, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{source}: {name} must be a string, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{source}: {name} must be true or false, got {value!r}")
    return value


def config_from_tl(config: dict, source: str, model_name: Optional[str] = None) -> Config:
    """The glassbox Config of a TransformerLens-format config.json (see the module docstring)."""
    sizes = {name: _field(config, name, int, source) for name in INT_FIELDS}
    attn_only = _field(config, "attn_only", bool, source)
    act = _field(config, "act_fn", str, source)
    if act not in ACT_FNS and not attn_only:
        raise ValueError(f"{source}: act_fn={act!r} is not an activation glassbox computes for this format "
                         f"({', '.join(ACT_FNS)})")
    act_fn, mlp_ln = ACT_FNS.get(act, ("gelu_new", False))
    key = "normalization" if "normalization" in config else "normalization_type"
    norm = _field(config, key, str, source) if key in config else None
    if norm not in ("LN", "RMS"):
        raise ValueError(f"{source}: {key}={norm!r} is not supported: glassbox loads TransformerLens checkpoints "
                         "with 'LN' or 'RMS' norms")
    final_rms = config.get("final_rms", False)
    if final_rms not in (False, None) and not (final_rms is True and norm == "RMS"):
        raise ValueError(f"{source}: final_rms={final_rms!r} is not supported: glassbox's final norm is the blocks' "
                         f"kind ({norm})")
    shortformer = config.get("shortformer_pos", False)
    if shortformer not in (False, None):
        raise ValueError(f"{source}: shortformer_pos={shortformer!r} is not supported: glassbox has no shortformer "
                         "positions (added to the queries and keys only)")
    tokenizer_name = config.get("tokenizer_name")
    if tokenizer_name is not None and (not isinstance(tokenizer_name, str) or not tokenizer_name.strip()):
        raise ValueError(f"{source}: tokenizer_name must be a repo id or folder, got {tokenizer_name!r}")
    try:
        return Config(**sizes, act_fn=act_fn, mlp_ln=mlp_ln and not attn_only, attn_only=attn_only,
                      normalization=norm, positional="learned", use_bias=True, tied_unembed=False,
                      unembed_bias=True, default_prepend_bos=True, model_name=model_name or "custom")
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def checkpoint_file(folder: Path) -> Path:
    """The one file of ``folder`` whose name ends in final.pth; FileNotFoundError naming the folder when
    there is none, ValueError naming them when there are several."""
    found = sorted(p for p in Path(folder).iterdir() if p.name.endswith(FINAL))
    if not found:
        raise FileNotFoundError(f"no TransformerLens checkpoint (*{FINAL}) in {folder}")
    if len(found) > 1:
        raise ValueError(f"{folder} holds several TransformerLens checkpoints ({', '.join(p.name for p in found)}); "
                         "keep the one to load")
    is_regular(found[0])  # a device or a dangling link is refused naming it
    return found[0]


def expected_shapes(cfg: Config) -> dict:
    """glassbox's state-dict keys and shapes for ``cfg`` (built without memory, on the meta device)."""
    from ..models import HookedTransformer

    with torch.device("meta"):
        model = HookedTransformer(cfg, init=False)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def to_glassbox(state: dict, cfg: Config, source: str) -> dict:
    """glassbox's state dict from TransformerLens's layout, every key and tensor checked first."""
    sd = {k: v for k, v in state.items() if not (isinstance(k, str) and k.endswith(BUFFERS))}
    renamed = {}
    if "unembed.W_U" in sd:
        W_U = sd.pop("unembed.W_U")
        sd["unembed.W_U_T"] = W_U.transpose(0, 1) if isinstance(W_U, torch.Tensor) and W_U.ndim == 2 else W_U
        renamed["unembed.W_U_T"] = "unembed.W_U"
    bad = [k for k in sd if not isinstance(k, str)]
    if bad:
        raise ValueError(f"{source}: key {bad[0]!r} is not a parameter name")
    check_state_dict(sd, expected_shapes(cfg), source, renamed)
    return {k: v.contiguous() for k, v in sd.items()}


def read_tl_folder(folder: Path, config: dict, model_name: Optional[str] = None) -> tuple:
    """(Config, glassbox state dict, checkpoint path) of a TransformerLens-format folder."""
    folder = Path(folder)
    source = str(folder / "config.json") + (f" (the snapshot of {model_name!r})" if model_name else "")
    cfg = config_from_tl(config, source, model_name or folder.name)
    path = checkpoint_file(folder)
    state = read_torch_checkpoint(path)
    return cfg, to_glassbox(state, cfg, str(path)), path
