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

Footgun: a caller of the attention itself (not the model) must pass ``past``, the number of cached
positions, so that the table covers every position id; the model does.
"""

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
        return self.W_pos[positions]


def rotary_tables(n_ctx: int, rotary_dim: int, base: float) -> tuple:
    """(cos, sin), each [n_ctx rotary_dim/2] float64: the angle of pair i at position p."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim)
    angles = torch.arange(n_ctx, dtype=torch.float64, device="cpu")[:, None] * inv_freq
    return angles.cos(), angles.sin()


class RotaryTable:
    """cos and sin of every pair's angle at positions [0, length), grown on demand, shared by layers."""

    MIN_ROWS = 64

    def __init__(self, n_ctx: int, rotary_dim: int, base: float, scaling=None):
        if scaling is not None:
            raise NotImplementedError(f"rope scaling {scaling.get('rope_type')!r} is not implemented yet")
        self.n_ctx, self.rotary_dim, self.base = n_ctx, rotary_dim, base
        self.scaling = scaling
        # (rows, cos float64, sin float64, {(device, dtype): (cos, sin)}), replaced whole when it
        # grows, so a reader on another thread never sees a cast copy of another size.
        self._state: tuple = (0, None, None, {})

    @property
    def key(self) -> tuple:
        """Tables with equal keys hold equal numbers (layers with equal keys share one table)."""
        return (self.n_ctx, self.rotary_dim, self.base, repr(sorted((self.scaling or {}).items())))

    @property
    def rows(self) -> int:
        return self._state[0]

    def tables(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple:
        """(cos, sin), each [rows rotary_dim/2] with rows >= length, on ``device`` in ``dtype``."""
        rows, cos64, sin64, cast = self._state
        if length > rows:
            rows = max(length, min(self.n_ctx, max(2 * rows, self.MIN_ROWS)))
            cos64, sin64 = rotary_tables(rows, self.rotary_dim, self.base)
            cast = {}
            self._state = (rows, cos64, sin64, cast)
        pair = cast.get((device, dtype))
        if pair is None:
            pair = cast[(device, dtype)] = (cos64.to(device=device, dtype=dtype), sin64.to(device=device, dtype=dtype))
        return pair

    def __repr__(self) -> str:
        return f"RotaryTable(rows={self.rows}, n_ctx={self.n_ctx}, rotary_dim={self.rotary_dim}, base={self.base})"


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
