"""Config: the frozen, validated description of a hooked transformer.

Every architectural choice is a field here and selects a component at construction; nothing in a
forward pass branches on these fields. ``d_head`` defaults to ``d_model // n_heads`` and ``d_mlp``
to ``4 * d_model``; errors name the field that is wrong and why.

The options: normalization "LN" | "RMS"; norm_placement "pre" (GPT-2) | "post" (x = norm(x + f(x)),
no final norm); parallel_attn_mlp (GPT-J: attention and MLP both read ln1 of the same residual);
attn_only (blocks with attention only, as TransformerLens's attn_only: resid_post = resid_pre + attn_out,
no ln2, no MLP, no hook_resid_mid; pre-norm only; d_mlp, act_fn and gated_mlp are then unused);
positional "learned" | "sinusoidal" | "rotary" (rotary_dim leading dims of each head rotated, pairs
(2i, 2i+1) with rotary_style "interleaved", (i, i + rotary_dim/2) with "half"); gated_mlp (SwiGLU
with act_fn "silu"); use_bias for every linear map and norm; tied_unembed; init_scheme "gpt2" |
"truncated_normal". Named combinations live in ``presets.py``.

``n_ctx`` must be in [1, 2**31]. Rotary models size their tables by the positions used, so a large
n_ctx costs nothing there; learned positions (W_pos [n_ctx d_model]) and sinusoidal ones (a buffer
of the same shape) still allocate n_ctx rows.
"""

import dataclasses
from dataclasses import dataclass
from typing import Optional

ACT_FNS = ("gelu_new", "gelu", "relu", "silu")
NORMALIZATIONS = ("LN", "RMS")
NORM_PLACEMENTS = ("pre", "post")
POSITIONALS = ("learned", "sinusoidal", "rotary")
ROTARY_STYLES = ("interleaved", "half")
INIT_SCHEMES = ("gpt2", "truncated_normal")
# Above any context length in use; a config past it is a typo or a sentinel, refused by name.
MAX_N_CTX = 2**31


@dataclass(frozen=True)
class Config:
    d_model: int
    n_layers: int
    n_heads: int
    d_vocab: int
    n_ctx: int
    d_head: Optional[int] = None
    d_mlp: Optional[int] = None
    act_fn: str = "gelu_new"
    gated_mlp: bool = False
    layer_norm_eps: float = 1e-5
    init_range: float = 0.02
    normalization: str = "LN"
    norm_placement: str = "pre"
    parallel_attn_mlp: bool = False
    attn_only: bool = False
    positional: str = "learned"
    rotary_dim: Optional[int] = None
    rotary_base: float = 10000.0
    rotary_style: str = "half"
    use_bias: bool = True
    tied_unembed: bool = True
    unembed_bias: bool = False
    init_scheme: str = "gpt2"
    default_prepend_bos: bool = True
    model_name: str = "custom"

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"):
            _positive_int(self, name)
        if self.n_ctx > MAX_N_CTX:
            raise ValueError(f"Config.n_ctx={self.n_ctx} is more than 2**31 positions; no model has that many "
                             "(is it a sentinel or a typo in max_position_embeddings / n_positions?)")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"Config.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "choose sizes that divide, or give d_head explicitly"
                )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        _positive_int(self, "d_head")
        _positive_int(self, "d_mlp")
        _one_of(self, "act_fn", ACT_FNS)
        _one_of(self, "normalization", NORMALIZATIONS)
        _one_of(self, "norm_placement", NORM_PLACEMENTS)
        _one_of(self, "positional", POSITIONALS)
        _one_of(self, "rotary_style", ROTARY_STYLES)
        _one_of(self, "init_scheme", INIT_SCHEMES)
        if self.parallel_attn_mlp and self.norm_placement != "pre":
            raise ValueError("Config.parallel_attn_mlp=True needs norm_placement='pre', got "
                             f"{self.norm_placement!r}")
        if not isinstance(self.attn_only, bool):
            raise ValueError(f"Config.attn_only must be a bool, got {self.attn_only!r}")
        if self.attn_only and self.parallel_attn_mlp:
            raise ValueError("Config.attn_only=True has no MLP to run in parallel: parallel_attn_mlp must be False")
        if self.attn_only and self.norm_placement != "pre":
            raise ValueError("Config.attn_only=True needs norm_placement='pre' (a post-norm attention-only "
                             f"block is not defined here), got {self.norm_placement!r}")
        if not self.rotary_base > 0:
            raise ValueError(f"Config.rotary_base must be > 0, got {self.rotary_base}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"Config.layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        if not self.init_range > 0:
            raise ValueError(f"Config.init_range must be > 0, got {self.init_range}")
        if self.positional == "rotary":
            if self.rotary_dim is None:
                object.__setattr__(self, "rotary_dim", self.d_head)
            if not (0 < self.rotary_dim <= self.d_head and self.rotary_dim % 2 == 0):
                raise ValueError(
                    f"Config.rotary_dim={self.rotary_dim} must be even and in (0, d_head={self.d_head}]"
                )
        elif self.rotary_dim is not None:
            raise ValueError(f"Config.rotary_dim is set but positional={self.positional!r}, not 'rotary'")
        if self.unembed_bias and self.tied_unembed is None:
            raise ValueError("Config.unembed_bias needs an unembedding")

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (validated again).

        Sizes that were derived (d_head = d_model // n_heads, d_mlp = 4 d_model, rotary_dim = d_head)
        are derived again from the new sizes unless given.
        """
        derived = {
            "d_head": ("d_model", "n_heads"), "d_mlp": ("d_model",), "rotary_dim": ("d_model", "n_heads", "d_head"),
        }
        defaults = {"d_head": self.d_model // self.n_heads, "d_mlp": 4 * self.d_model,
                    "rotary_dim": self.d_head if self.positional == "rotary" else None}
        for field, sources in derived.items():
            if field not in changes and any(s in changes for s in sources) and getattr(self, field) == defaults[field]:
                changes[field] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _positive_int(cfg: Config, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Config.{name} must be a positive int, got {value!r}")


def _one_of(cfg: Config, name: str, options: tuple) -> None:
    value = getattr(cfg, name)
    if value not in options:
        raise ValueError(f"Config.{name} must be one of {options}, got {value!r}")
