"""Config: the frozen, validated description of a hooked transformer.

Every architectural choice is a field here and selects a component at construction; nothing in a
forward pass branches on these fields. ``d_head`` defaults to ``d_model // n_heads`` and ``d_mlp``
to ``4 * d_model``; errors name the field that is wrong and why.

The options: normalization "LN" | "RMS"; norm_placement "pre" (GPT-2) | "post" (x = norm(x + f(x)),
no final norm); parallel_attn_mlp (GPT-J: attention and MLP both read ln1 of the same residual);
attn_only (blocks with attention only, as TransformerLens's attn_only: resid_post = resid_pre + attn_out,
no ln2, no MLP, no hook_resid_mid; pre-norm only; d_mlp, act_fn and gated_mlp are then unused);
positional "learned" | "sinusoidal" | "rotary" (rotary_dim leading dims of each head rotated, pairs
(2i, 2i+1) with rotary_style "interleaved", (i, i + rotary_dim/2) with "half"); act_fn, any name of
``activations.py`` (transformers' names); gated_mlp (SwiGLU with act_fn "silu", GeGLU with "gelu_new");
mlp_ln (a norm of the model's
normalization over d_mlp between the activation and W_out: TransformerLens's SoLU MLP, act_fn "solu"
with mlp_ln=True; not with gated_mlp or attn_only); use_bias for every linear map and norm; tied_unembed; init_scheme "gpt2" |
"truncated_normal". Named combinations live in ``presets.py``.

The options of today's model families (each defaults to GPT-2's behaviour):
- n_key_value_heads: grouped-query (1 < n < n_heads) or multi-query (1) attention; must divide n_heads.
  Query head h reads key/value head h // (n_heads / n_key_value_heads). ungroup_grouped_query_attention
  repeats keys and values to n_heads before their hooks (TransformerLens's flag of that name).
- qkv_bias, attn_out_bias, mlp_bias: per-part biases (None: use_bias). Qwen2 has q/k/v biases only.
- attn_scale: the factor on q.k (None: 1/sqrt(d_head)); scale_attn_by_inverse_layer_idx divides layer
  L's scores by L + 1 as well (GPT-2's options); upcast_attn computes scores and softmax in float32
  for half-precision models (GPT-2's reorder_and_upcast_attn).
- qk_norm: None | "head" (RMSNorm over each head's d_head, one weight shared by the heads: Qwen3,
  Gemma 3) | "full" (RMSNorm over all heads' queries together, keys likewise: OLMo 2); after W_Q/W_K,
  before the rotation.
- attn_scores_soft_cap, output_logits_soft_cap: cap * tanh(x / cap) on the scores (before the mask)
  and on the logits (Gemma 2).
- attn_types: one of "global" | "local" per layer (None: all global); local layers attend to the
  window_size most recent positions, themselves included (q - k < window_size: Gemma 2 and 3,
  Mistral, Qwen2), and use rotary_base_local (without rope_scaling) when it is set (Gemma 3).
- rope_scaling: None or a dict {"rope_type": "linear" | "dynamic" | "llama3" | "yarn", ...} with
  Hugging Face's parameter names (see ``positional.py``).
- norm_weight_offset: norms multiply by (offset + w) (Gemma: 1.0, w stored as in the checkpoint).
- scale_embed: token embeddings times sqrt(d_model), the factor rounded to the model's dtype (Gemma).
- norm_placement "sandwich": x + norm_post(f(norm(x))) (Gemma 2 and 3: ln1, ln1_post, ln2, ln2_post);
  "output": x + norm(f(x)) (OLMo 2: ln1 and ln2 normalise the sublayers' outputs).
- gated_mlp_bias: "inputs" (b_gate and b_in on the gated MLP's two projections, as transformers) |
  "product" (no b_gate; b_in added to act(gate) * linear, TransformerLens's GatedMLP); see gated_mlp.py.
- parallel_ln2: in a parallel block the MLP reads its own norm ln2(resid_pre) (GPT-NeoX), not ln1's
  output (GPT-J).

``n_ctx`` must be in [1, 2**31]. Rotary models size their tables by the positions used, so a large
n_ctx costs nothing there; learned positions (W_pos [n_ctx d_model]) and sinusoidal ones (a buffer
of the same shape) still allocate n_ctx rows.
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from .activations import ALL_ACTIVATIONS

ACT_FNS = tuple(ALL_ACTIVATIONS)
NORMALIZATIONS = ("LN", "RMS")
NORM_PLACEMENTS = ("pre", "post", "sandwich", "output")
QK_NORMS = (None, "head", "full")
ATTN_TYPES = ("global", "local")
ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")
POSITIONALS = ("learned", "sinusoidal", "rotary")
ROTARY_STYLES = ("interleaved", "half")
INIT_SCHEMES = ("gpt2", "truncated_normal")
GATED_MLP_BIASES = ("inputs", "product")
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
    n_key_value_heads: Optional[int] = None
    ungroup_grouped_query_attention: bool = False
    qkv_bias: Optional[bool] = None
    attn_out_bias: Optional[bool] = None
    mlp_bias: Optional[bool] = None
    attn_scale: Optional[float] = None
    scale_attn_by_inverse_layer_idx: bool = False
    upcast_attn: bool = False
    qk_norm: Optional[str] = None
    attn_scores_soft_cap: Optional[float] = None
    output_logits_soft_cap: Optional[float] = None
    attn_types: Optional[tuple] = None
    window_size: Optional[int] = None
    rotary_base_local: Optional[float] = None
    rope_scaling: Optional[dict] = None
    norm_weight_offset: float = 0.0
    scale_embed: bool = False
    parallel_ln2: bool = False
    gated_mlp_bias: str = "inputs"
    mlp_ln: bool = False

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
        if not isinstance(self.mlp_ln, bool):
            raise ValueError(f"Config.mlp_ln must be a bool, got {self.mlp_ln!r}")
        if self.mlp_ln and (self.gated_mlp or self.attn_only):
            raise ValueError("Config.mlp_ln=True normalises the activation of a plain MLP; it cannot be combined with "
                             f"gated_mlp={self.gated_mlp} or attn_only={self.attn_only}")
        if self.attn_only and self.norm_placement != "pre":
            raise ValueError("Config.attn_only=True needs norm_placement='pre' (a post-norm attention-only "
                             f"block is not defined here), got {self.norm_placement!r}")
        for name in ("rotary_base", "layer_norm_eps", "init_range"):
            _positive_number(self, name)
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
        self._check_family_options()

    def _check_family_options(self) -> None:
        if self.n_key_value_heads is None:
            object.__setattr__(self, "n_key_value_heads", self.n_heads)
        _positive_int(self, "n_key_value_heads")
        if self.n_heads % self.n_key_value_heads:
            raise ValueError(f"Config.n_key_value_heads={self.n_key_value_heads} must divide n_heads={self.n_heads}")
        for name in ("qkv_bias", "attn_out_bias", "mlp_bias"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.use_bias)
        for name in ("ungroup_grouped_query_attention", "qkv_bias", "attn_out_bias", "mlp_bias",
                     "scale_attn_by_inverse_layer_idx", "upcast_attn", "scale_embed", "parallel_ln2"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Config.{name} must be a bool, got {getattr(self, name)!r}")
        _positive_number(self, "attn_scale", "None for 1/sqrt(d_head)")
        _one_of(self, "qk_norm", QK_NORMS)
        _one_of(self, "gated_mlp_bias", GATED_MLP_BIASES)
        for name in ("attn_scores_soft_cap", "output_logits_soft_cap"):
            _positive_number(self, name, "None for no cap")
        if self.attn_types is not None:
            object.__setattr__(self, "attn_types", tuple(self.attn_types))
            if len(self.attn_types) != self.n_layers or any(t not in ATTN_TYPES for t in self.attn_types):
                raise ValueError(f"Config.attn_types must give one of {ATTN_TYPES} for each of the n_layers="
                                 f"{self.n_layers} layers, got {self.attn_types!r}")
            if "local" in self.attn_types:
                _positive_int(self, "window_size")
        if self.window_size is not None and "local" not in (self.attn_types or ()):
            raise ValueError("Config.window_size is set but no layer is local (attn_types); set attn_types, e.g. "
                             "('local',) * n_layers for sliding-window attention in every layer")
        _positive_number(self, "rotary_base_local", "None for rotary_base")
        if self.rotary_base_local is not None and self.positional != "rotary":
            raise ValueError(f"Config.rotary_base_local={self.rotary_base_local!r} needs positional='rotary'")
        if self.rope_scaling is not None:
            if self.positional != "rotary":
                raise ValueError("Config.rope_scaling is set but positional is not 'rotary'")
            if not isinstance(self.rope_scaling, dict) or self.rope_scaling.get("rope_type") not in ROPE_TYPES:
                raise ValueError(f"Config.rope_scaling must be a dict whose 'rope_type' is one of {ROPE_TYPES}, got "
                                 f"{self.rope_scaling!r}")
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
            from .positional import check_rope_scaling  # positional imports this module

            check_rope_scaling(self.rope_scaling, self.rotary_dim, self.rotary_base)
        if not isinstance(self.norm_weight_offset, (int, float)) or isinstance(self.norm_weight_offset, bool):
            raise ValueError(f"Config.norm_weight_offset must be a number, got {self.norm_weight_offset!r}")
        if self.norm_weight_offset and self.normalization != "RMS":
            raise ValueError("Config.norm_weight_offset is for RMSNorm models (Gemma); normalization is "
                             f"{self.normalization!r}")
        if self.parallel_ln2 and not self.parallel_attn_mlp:
            raise ValueError("Config.parallel_ln2=True needs parallel_attn_mlp=True")
        if self.qk_norm == "full" and self.ungroup_grouped_query_attention and self.n_key_value_heads < self.n_heads:
            raise ValueError("Config.qk_norm='full' normalises the grouped keys together, so it cannot be combined "
                             "with ungroup_grouped_query_attention=True")
        if self.qk_norm is not None and self.normalization != "RMS":
            raise ValueError("Config.qk_norm is an RMSNorm of queries and keys; it needs normalization='RMS'")

    @property
    def n_kv_groups(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_key_value_heads

    def layer_attn_type(self, layer: int) -> str:
        return "global" if self.attn_types is None else self.attn_types[layer]

    def layer_attn_scale(self, layer: int) -> float:
        """The factor layer ``layer`` multiplies q.k by."""
        scale = self.attn_scale if self.attn_scale is not None else self.d_head ** -0.5
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed (validated again).

        Sizes that were derived (d_head = d_model // n_heads, d_mlp = 4 d_model, rotary_dim = d_head)
        are derived again from the new sizes unless given.
        """
        derived = {
            "d_head": ("d_model", "n_heads"), "d_mlp": ("d_model",), "rotary_dim": ("d_model", "n_heads", "d_head"),
            "n_key_value_heads": ("n_heads",),
        }
        defaults = {"d_head": self.d_model // self.n_heads, "d_mlp": 4 * self.d_model,
                    "rotary_dim": self.d_head if self.positional == "rotary" else None,
                    "n_key_value_heads": self.n_heads}
        for field, sources in derived.items():
            if field not in changes and any(s in changes for s in sources) and getattr(self, field) == defaults[field]:
                changes[field] = None
        if "use_bias" in changes:  # per-part biases that followed use_bias follow it again
            for field in ("qkv_bias", "attn_out_bias", "mlp_bias"):
                if field not in changes and getattr(self, field) == self.use_bias:
                    changes[field] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _positive_number(cfg: Config, name: str, none: Optional[str] = None) -> None:
    """A finite int or float > 0 (not a bool); None too where ``none`` says what None means."""
    value = getattr(cfg, name)
    if value is None and none is not None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        alternative = f" (or {none})" if none is not None else ""
        raise ValueError(f"Config.{name} must be a finite number > 0{alternative}, got {value!r}")


def _positive_int(cfg: Config, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"Config.{name} must be a positive int, got {value!r}")


def _one_of(cfg: Config, name: str, options: tuple) -> None:
    value = getattr(cfg, name)
    if value not in options:
        from ..suggest import did_you_mean

        raise ValueError(f"Config.{name} must be one of {options}, got {value!r}{did_you_mean(value, options)}")
