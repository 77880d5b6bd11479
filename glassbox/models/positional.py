"""Fixed position encodings: sinusoidal embeddings added to the residual stream, and the rotary
tables and rotations applied to queries and keys.

Sinusoidal (Vaswani et al.): PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same).
It is a buffer, not a parameter: it is not trained and not saved in the state dict.

Rotary: the first ``rotary_dim`` dims of every head are split into pairs, and pair i at position p
is rotated by the angle p * base^(-2i/rotary_dim). The pairing convention matters and differs
between model families: "interleaved" pairs dims (2i, 2i+1) (GPT-J), "half" pairs (i, i + r/2)
(GPT-NeoX, Llama). Dims past rotary_dim pass through unrotated. Angles are computed in float64 (on
the CPU) and then cast to the dtype of the queries, so tables agree with any float32 reference to
rounding, and a model cast to another dtype or device after construction reads tables of its new
dtype (the float64 values cast again, never a float32 table widened).

The rotary table is sized by use, not by n_ctx: ``RotaryTable`` holds the rows of the positions
seen so far, grows (doubling, up to n_ctx) when a longer sequence comes, and keeps one cast copy per
(device, dtype). One table serves every layer of a model. A config whose n_ctx is 10**8 therefore
builds as fast as one of 1024; row p is the same number whichever size the table has (each row is
computed from p alone, and a test checks the bits).

Rope scaling (``Config.rope_scaling``, the ``scaling`` of a ``RotaryTable``) follows transformers
5.x's rope types exactly, in float64: a dict with Hugging Face's key names,
- {"rope_type": "linear", "factor"}: every frequency divided by factor;
- {"rope_type": "dynamic", "factor", "original_max_position_embeddings"}: NTK scaling, the base
  raised for the current sequence length s > original: base * (factor s / original - (factor - 1))
  ** (r / (r - 2));
- {"rope_type": "llama3", "factor", "original_max_position_embeddings", "low_freq_factor",
  "high_freq_factor"}: long wavelengths slowed by factor, short ones kept, those between blended;
- {"rope_type": "yarn", "factor", "original_max_position_embeddings", optional "attention_factor",
  "beta_fast" (32), "beta_slow" (1), "mscale", "mscale_all_dim", "truncate" (True)}: frequencies
  blended between kept and slowed over a ramp of pairs, and cos and sin multiplied by the attention
  factor (so q.k by its square; dims past rotary_dim are not scaled), as transformers does.
A missing or unknown key, or a bad value, raises ValueError naming the key and the rope_type.

The rule for what transformers derives from the rest of its config: nothing is derived here, and
nothing from n_ctx (which only limits positions). original_max_position_embeddings is required
where it is used: for yarn and llama3 it is the key transformers fills from max_position_embeddings
when absent; for dynamic it is the length transformers' dynamic scaling starts after, its config's
max_position_embeddings (a converter writes it; n_ctx can then exceed it, as the positions
transformers accepts do). "rope_theta" and "partial_rotary_factor" are refused in the dict: they are
Config.rotary_base and Config.rotary_dim (the table's ``base`` and ``rotary_dim``). Converters apply
this rule with ``rope_scaling_from_hf`` (transformers' rope_parameters -> rope_scaling) and
``rope_parameters_for_hf`` (back, with the max_position_embeddings the dynamic type needs).

The dynamic type has state, as transformers' rotary embedding does (one table per model, shared by
its layers): each forward's sequence length is max(position id) + 1 (with left padding the longest
row's, as transformers' generate numbers positions); longer than the length the
current frequencies are for, they are recomputed for it; shorter than
original_max_position_embeddings after a longer one, they reset to the original ones; otherwise
they are kept (a forward of 20 positions after one of 30 uses the 30-position frequencies). Keys in
a key-value cache keep the rotation they were stored with, so greedy generation with a cache equals
transformers' generate with its cache (and differs from recomputing without one, past the
original length). Its table is rebuilt, at the rows needed, at each change. Footguns: the state is
the model's, not the call's (a copy of the model carries it; only a sequence shorter than the
original resets it); forwards of one model on several threads with lengths past the original race
for it; a forward that raises has updated it already, as in transformers.

Footgun: a caller of the attention itself (not the model) must pass ``past``, the number of cached
positions, so that the table covers every position id; the model does.
"""

import math
from typing import Optional

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from .config import Config


def sinusoidal_table(n_ctx: int, d_model: int) -> Float[Tensor, "pos d_model"]:
    """The [n_ctx d_model] sinusoidal table (float64); an odd d_model drops its last cos column."""
    pos = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.empty(n_ctx, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)[:, : d_model // 2]
    return table


class SinusoidalPosEmbed(nn.Module):
    """Looks up the fixed sinusoidal table; ``W_pos`` has the learned embedding's name and shape."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.register_buffer("W_pos", sinusoidal_table(cfg.n_ctx, cfg.d_model), persistent=False)

    def forward(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.lookup(positions)

    def lookup(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_pos[positions]


ROPE_KEYS = {  # rope_type: (required keys, optional keys), besides "rope_type" itself
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor", "original_max_position_embeddings"}, set()),
    "llama3": ({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}, set()),
    "yarn": ({"factor", "original_max_position_embeddings"},
             {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}
# Keys of Hugging Face's rope_parameters whose number lives elsewhere in a glassbox Config.
KEYS_ELSEWHERE = {"rope_theta": "Config.rotary_base", "partial_rotary_factor": "Config.rotary_dim",
                  "type": "the old name of 'rope_type'"}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_rope_scaling(scaling, rotary_dim: int, base: float) -> None:
    """Raise ValueError, naming the key and the rope_type, unless ``scaling`` is a rope-scaling dict
    that ``rope_frequencies`` computes exactly (see the module docstring for the keys)."""
    if not isinstance(scaling, dict):
        raise ValueError(f"rope scaling must be a dict with a 'rope_type', got {scaling!r}")
    rope_type = scaling.get("rope_type")
    if rope_type not in ROPE_KEYS:
        raise ValueError(f"rope scaling: rope_type={rope_type!r} is not one of {tuple(ROPE_KEYS)}")
    required, optional = ROPE_KEYS[rope_type]
    where = f"rope scaling (rope_type {rope_type!r})"
    for key in scaling:
        if key in KEYS_ELSEWHERE:
            raise ValueError(f"{where}: key {key!r} does not belong in the dict; it is {KEYS_ELSEWHERE[key]}")
        if key != "rope_type" and key not in required | optional:
            raise ValueError(f"{where}: unknown key {key!r}; the keys are {sorted(required | optional)}")
    missing = sorted(required - set(scaling))
    if missing:
        hint = (" (for 'dynamic': transformers' max_position_embeddings, the length its scaling starts "
                "after; Config.n_ctx only limits the positions)") if rope_type == "dynamic" else ""
        raise ValueError(f"{where}: missing key {missing[0]!r}{hint}; required are {sorted(required)}")

    def refuse(key, why):
        raise ValueError(f"{where}: {key}={scaling[key]!r} {why}")

    if not (_finite(scaling["factor"]) and scaling["factor"] >= 1):
        refuse("factor", "must be a finite number >= 1")
    ompe = scaling.get("original_max_position_embeddings")
    if "original_max_position_embeddings" in scaling and not (
            isinstance(ompe, int) and not isinstance(ompe, bool) and ompe >= 1):
        refuse("original_max_position_embeddings", "must be a positive int")
    if rope_type == "dynamic" and rotary_dim <= 2:
        raise ValueError(f"{where}: rotary_dim={rotary_dim} must be > 2 (the base is raised to dim / (dim - 2))")
    if rope_type == "llama3":
        low = scaling["low_freq_factor"]
        if not (_finite(low) and low > 0):
            refuse("low_freq_factor", "must be a finite number > 0")
        if not (_finite(scaling["high_freq_factor"]) and scaling["high_freq_factor"] > low):
            refuse("high_freq_factor", f"must be a finite number > low_freq_factor={low!r}")
    if rope_type == "yarn":
        for key in ("attention_factor", "beta_fast", "beta_slow"):
            if scaling.get(key) is not None and not (_finite(scaling[key]) and scaling[key] > 0):
                refuse(key, "must be a finite number > 0 (or None for the default)")
        for key in ("mscale", "mscale_all_dim"):
            if scaling.get(key) is not None and not _finite(scaling[key]):
                refuse(key, "must be a finite number (or None)")
        if "truncate" in scaling and not isinstance(scaling["truncate"], bool):
            refuse("truncate", "must be True or False")
        fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
        if fast < slow:
            raise ValueError(f"{where}: beta_fast={fast!r} must be >= beta_slow={slow!r} (defaults 32 and 1)")
        if base == 1:
            raise ValueError(f"{where}: rotary_base=1 is refused (the correction range divides by log(base))")
        factor = yarn_attention_factor(scaling)
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"{where}: mscale={scaling.get('mscale')!r} and mscale_all_dim="
                             f"{scaling.get('mscale_all_dim')!r} give the attention factor {factor!r}, not > 0")


def rope_scaling_from_hf(rope_parameters: Optional[dict], max_position_embeddings: int) -> Optional[dict]:
    """``Config.rope_scaling`` for a transformers config's rope_parameters: None for the "default"
    type; else the dict without rope_theta (Config.rotary_base) and a partial_rotary_factor of 1
    (another value is refused: it is Config.rotary_dim, which the caller sets), "type" read as
    "rope_type", and original_max_position_embeddings as transformers reads it: for yarn and llama3
    the dict's, else max_position_embeddings; for dynamic always max_position_embeddings (transformers'
    dynamic scaling ignores the dict's). The dict is validated when a model is built."""
    scaling = dict(rope_parameters or {})
    if "type" in scaling:
        scaling.setdefault("rope_type", scaling.pop("type"))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "default":
        return None
    scaling.pop("rope_theta", None)
    if scaling.pop("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"rope_parameters partial_rotary_factor={rope_parameters['partial_rotary_factor']!r} "
                         f"(rope_type {rope_type!r}) is Config.rotary_dim; map it there and drop it from the dict")
    if rope_type == "dynamic":
        scaling["original_max_position_embeddings"] = max_position_embeddings
    elif rope_type in ("yarn", "llama3"):
        scaling.setdefault("original_max_position_embeddings", max_position_embeddings)
    return scaling


def rope_parameters_for_hf(scaling: Optional[dict], base: float) -> tuple:
    """(transformers' rope_parameters, the max_position_embeddings it needs or None) for
    ``Config.rope_scaling`` and rotary_base: the dynamic type's original_max_position_embeddings is
    transformers' max_position_embeddings (the length its scaling starts after), not a dict key."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": base}, None
    params = {**scaling, "rope_theta": base}
    if params["rope_type"] == "dynamic":
        return params, params.pop("original_max_position_embeddings")
    return params, None


def yarn_attention_factor(scaling: dict) -> float:
    """The factor on yarn's cos and sin: ``attention_factor`` if given, else 0.1 ln(factor) + 1
    (with mscale and mscale_all_dim both set and nonzero: the ratio of that with each as the weight)."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]

    def scale(weight) -> float:
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    weight, weight_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if weight and weight_all:
        denominator = scale(weight_all)
        return float(scale(weight) / denominator) if denominator != 0 else math.inf
    return scale(1)


def dynamic_base(base: float, rotary_dim: int, scaling: dict, seq_len: int) -> float:
    """The dynamic (NTK) type's base for a sequence of ``seq_len`` positions (the base itself, to
    rounding, up to original_max_position_embeddings)."""
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    seq_len = max(seq_len, original)
    return base * ((factor * seq_len / original) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict) -> Tensor:
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    # Wavelengths longer than original / low are slowed by factor, shorter than original / high kept,
    # and those between blended by where original / wavelength falls in [low, high].
    slowed = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    blend = (original / wavelength - low) / (high - low)
    blended = (1 - blend) * slowed / factor + blend * slowed
    between = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(between, blended, slowed)


def _yarn_inv_freq(rotary_dim: int, base: float, scaling: dict) -> Tensor:
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

    def pair_turning(rotations: float) -> float:
        """The (fractional) pair index whose angle turns ``rotations`` times over ``original`` positions."""
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(scaling.get("beta_fast") or 32), pair_turning(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # as transformers: a step instead of a division by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the weight of the unscaled frequency (fast pairs); 1 - keep that of the slowed one
    powers = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim)
    return 1.0 / (factor * powers) * (1 - keep) + 1.0 / powers * keep


def rope_frequencies(rotary_dim: int, base: float, scaling: Optional[dict] = None, seq_len: int = 0) -> tuple:
    """(inv_freq [rotary_dim/2] float64 on the CPU, the factor on cos and sin) for ``scaling`` (a
    dict ``check_rope_scaling`` accepts, or None); ``seq_len`` matters to the dynamic type only."""
    rope_type = scaling["rope_type"] if scaling else None
    if rope_type == "dynamic":
        base = dynamic_base(base, rotary_dim, scaling, seq_len)
    if rope_type == "yarn":
        return _yarn_inv_freq(rotary_dim, base, scaling), yarn_attention_factor(scaling)
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim)
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    return inv_freq, 1.0


def rotary_tables(rows: int, inv_freq: Tensor, attention_factor: float = 1.0) -> tuple:
    """(cos, sin), each [rows rotary_dim/2] float64: the angle p * inv_freq[i] of pair i at position p,
    times ``attention_factor``."""
    angles = torch.arange(rows, dtype=torch.float64, device="cpu")[:, None] * inv_freq
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin


class RotaryTable:
    """cos and sin of every pair's angle at positions [0, length), grown on demand, shared by layers;
    with ``scaling`` (a rope-scaling dict, validated here) its frequencies are scaled."""

    MIN_ROWS = 64

    def __init__(self, n_ctx: int, rotary_dim: int, base: float, scaling: Optional[dict] = None):
        if scaling is not None:
            check_rope_scaling(scaling, rotary_dim, base)
            scaling = dict(scaling)
        self.n_ctx, self.rotary_dim, self.base = n_ctx, rotary_dim, base
        self.scaling = scaling
        self.rope_type = scaling["rope_type"] if scaling else "default"
        self.dynamic = self.rope_type == "dynamic"
        # The dynamic type's frequencies are those of the longest sequence seen since the last short
        # one (transformers' max_seq_len_cached); they start at, and reset to, the original length.
        self.original = scaling["original_max_position_embeddings"] if self.dynamic else 0
        inv_freq, factor = rope_frequencies(rotary_dim, base, scaling, self.original)
        # (rows, cos float64, sin float64, {(device, dtype): (cos, sin)}, frequencies' length, inv_freq,
        # attention factor), replaced whole when it changes, so a reader on another thread never sees
        # a cast copy of another size or other frequencies.
        self._state: tuple = (0, None, None, {}, self.original, inv_freq, factor)

    @property
    def key(self) -> tuple:
        """Tables with equal keys hold equal numbers (layers with equal keys share one table)."""
        return (self.n_ctx, self.rotary_dim, self.base, repr(sorted((self.scaling or {}).items())))

    @property
    def rows(self) -> int:
        return self._state[0]

    @property
    def inv_freq(self) -> Tensor:
        """The current inverse frequencies [rotary_dim/2] (float64, CPU); dynamic: of the current state."""
        return self._state[5]

    @property
    def attention_factor(self) -> float:
        """The factor on cos and sin (yarn's; 1.0 for the other types)."""
        return self._state[6]

    @property
    def frequencies_length(self) -> int:
        """Dynamic type: the sequence length the current frequencies are for; 0 for the others."""
        return self._state[4]

    def tables(self, length: int, device: torch.device, dtype: torch.dtype,
               positions: Optional[Tensor] = None) -> tuple:
        """(cos, sin), each [rows rotary_dim/2] with rows >= length, on ``device`` in ``dtype``.

        The dynamic type first updates its frequencies from the sequence length, max(positions) + 1
        (``length`` when positions is None), as transformers' dynamic update does: longer than the
        current frequencies' length -> recomputed for it; shorter than original_max_position_embeddings
        after a longer one -> reset to the original frequencies; otherwise kept."""
        rows, cos64, sin64, cast, freq_len, inv_freq, factor = self._state
        changed = False
        if self.dynamic:
            seq_len = int(positions.max()) + 1 if positions is not None and positions.numel() else length
            if seq_len > freq_len:
                new_len = seq_len
            elif seq_len < self.original < freq_len:
                new_len = self.original
            else:
                new_len = freq_len
            if new_len != freq_len:
                freq_len, changed = new_len, True
                inv_freq, factor = rope_frequencies(self.rotary_dim, self.base, self.scaling, freq_len)
        if length > rows or changed:
            if changed:  # rebuilt anyway at the next change: no room to grow into
                rows = max(length, min(self.n_ctx, self.MIN_ROWS))
            elif length > rows:
                rows = max(length, min(self.n_ctx, max(2 * rows, self.MIN_ROWS)))
            cos64, sin64 = rotary_tables(rows, inv_freq, factor)
            cast = {}
            self._state = (rows, cos64, sin64, cast, freq_len, inv_freq, factor)
        pair = cast.get((device, dtype))
        if pair is None:
            pair = cast[(device, dtype)] = (cos64.to(device=device, dtype=dtype), sin64.to(device=device, dtype=dtype))
        return pair

    def __repr__(self) -> str:
        scaled = f", rope_type={self.rope_type!r}" if self.scaling else ""
        return (f"RotaryTable(rows={self.rows}, n_ctx={self.n_ctx}, rotary_dim={self.rotary_dim}, "
                f"base={self.base}{scaled})")


def rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [... d_head], cos and sin broadcastable to [... r/2]: pairs (i, i + r/2) rotated."""
    r = 2 * cos.shape[-1]
    x1, x2, rest = x[..., : r // 2], x[..., r // 2: r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [... d_head], cos and sin broadcastable to [... r/2]: pairs (2i, 2i+1) rotated."""
    r = 2 * cos.shape[-1]
    x1, x2, rest = x[..., 0:r:2], x[..., 1:r:2], x[..., r:]
    rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1)


ROTATIONS = {"half": rotate_half, "interleaved": rotate_interleaved}


def scaled_context(max_position_embeddings: int, scaling) -> int:
    """``Config.n_ctx`` of a converted rotary model: transformers' max_position_embeddings, except for
    the dynamic type, which exists to run past that length (where its scaling starts): its context
    is ``factor`` times longer. Converters export ``original_max_position_embeddings`` back as
    max_position_embeddings (``rope_parameters_for_hf``)."""
    if scaling is not None and scaling.get("rope_type") == "dynamic":
        return math.ceil(max_position_embeddings * scaling["factor"])
    return max_position_embeddings
