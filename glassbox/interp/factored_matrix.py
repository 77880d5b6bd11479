"""FactoredMatrix: a matrix M = A @ B kept as its two factors, for low-rank circuits (OV, QK).

A is [... ldim mdim] and B [... mdim rdim]; their leading dims broadcast (both factors are stored as
broadcast views of one leading shape), so ``FactoredMatrix(model.W_V, model.W_O)`` is every head's
[d_model d_model] OV circuit at once, with hidden dim d_head. TransformerLens's meanings throughout:

- ``M @ X`` and ``X @ M`` for a matrix X give a FactoredMatrix, keeping the smaller hidden dim: with a
  matrix on the right, ``FactoredMatrix(A, B @ X)`` when rdim > mdim, else ``FactoredMatrix(AB, X)``
  (mirrored on the left); a product of two FactoredMatrix splits at the smallest of their inner dims.
  ``M @ v`` and ``v @ M`` for a vector v [rdim] or [ldim] return a plain tensor [... ldim] or [... rdim].
  ``M * c`` (or ``c * M``) for a scalar c scales A.
- ``AB`` forms M; ``BA`` is the [mdim mdim] product B @ A (square M only); ``T`` is M's transpose.
- ``svd()`` returns (U, S, V) with M = U diag(S) V^T, U [... ldim k], S [... k], V [... rdim k],
  k = min(ldim, mdim, rdim), from the SVDs of A, of B and of the small [k_A k_B] middle
  diag(S_A) Vh_A U_B diag(S_B); M is never formed. ``U``, ``S``, ``V`` are its parts, ``norm()`` the
  Frobenius norm sqrt(sum S^2), ``make_even()`` the factorisation (U sqrt(S), sqrt(S) V^T),
  ``collapse_l()`` S V^T [... k rdim] and ``collapse_r()`` U S [... ldim k].
- ``eigenvalues`` are those of BA [... mdim] (complex): M's nonzero eigenvalues, plus mdim - ldim
  zeros when mdim > ldim (M has ldim - mdim more zeros when mdim < ldim).
- Indexing ``M[i]`` applies to the leading dims; an index with one more entry also picks rows (ldim),
  with two more rows and columns (rdim). A row or column index is an int (kept as a dim of size 1, as
  in TransformerLens), a slice, or a 1-d list or tensor of indices; ``...`` expands as for a tensor.

Errors: a bad shape is a ValueError naming both shapes; where TransformerLens asserts (inner dims,
``*`` of a non-scalar, ``BA`` of a non-square M) it is also an AssertionError, and where it raises
RuntimeError (leading dims that do not broadcast) also a RuntimeError (``glassbox.hooks.errors``).

Footguns:
- ``svd()`` (and so U, S, V, norm, make_even, collapse_l, collapse_r) costs about
  O(ldim mdim k + mdim rdim k) per leading index: cheap when mdim is small (d_head against d_model),
  no cheaper than the SVD of M when mdim >= ldim, rdim. Broadcast leading dims are materialised, one
  SVD per index of the broadcast shape. The result is cached on the instance: changing A or B in
  place afterwards leaves it stale. Singular vectors are unique only up to sign (and rotation within
  repeated singular values); compare U diag(S) V^T, never U or V alone. The trailing singular values of
  a rank-deficient M are rounding noise, not exact zeros.
- float16 and bfloat16 factors are promoted to float32 for ``svd()`` and ``eigenvalues`` (torch has no
  half-precision SVD or eig on CPU); their results are float32.
- ``AB`` forms the full [... ldim rdim] matrix: for every head of a large model that is
  layer * head * d_model^2 numbers. Use ``get_corner(k)`` to look at a corner cheaply.
- ``M[..., i, j]`` keeps the row and column dims (size 1), unlike tensor indexing; ``None`` (a new
  axis) may stand only among the leading indices.
"""

import operator
import warnings
from functools import cached_property
from typing import Tuple, Union

import torch
from jaxtyping import Complex, Float
from torch import Tensor

from ..hooks.errors import ArgumentError, BroadcastError

HALF = (torch.float16, torch.bfloat16)


def _shape(x) -> tuple:
    return tuple(x.shape)


def _leading(first: tuple, second: tuple, what: str) -> torch.Size:
    try:
        return torch.broadcast_shapes(torch.Size(first), torch.Size(second))
    except RuntimeError:
        raise BroadcastError(f"{what}: Shape mismatch: leading dims {first} and {second} do not broadcast") from None


def _full(x: Tensor) -> Tensor:
    return x.float() if x.dtype in HALF else x


class FactoredMatrix:
    """M = A @ B with A [... ldim mdim] and B [... mdim rdim]; leading dims broadcast."""

    def __init__(self, A: Float[Tensor, "... ldim _mdim"], B: Float[Tensor, "... _mdim rdim"]):
        for name, x in (("A", A), ("B", B)):
            if not isinstance(x, Tensor) or x.ndim < 2:
                got = _shape(x) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"FactoredMatrix: {name} must be a tensor of at least 2 dims, got {got}")
        if A.shape[-1] != B.shape[-2]:
            raise ArgumentError(f"FactoredMatrix: inner dims differ: A {_shape(A)} has mdim {A.shape[-1]}, "
                                f"B {_shape(B)} has {B.shape[-2]} (the factors must match on inner dimension)")
        if A.dtype != B.dtype or A.device != B.device:
            raise ValueError(f"FactoredMatrix: A is {A.dtype} on {A.device}, B {B.dtype} on {B.device}; "
                             "the factors must agree")
        self.ldim, self.mdim, self.rdim = A.shape[-2], A.shape[-1], B.shape[-1]
        lead = _leading(_shape(A)[:-2], _shape(B)[:-2], f"FactoredMatrix of A {_shape(A)} and B {_shape(B)}")
        self.shape = lead + (self.ldim, self.rdim)
        self.A = A.broadcast_to(lead + (self.ldim, self.mdim))
        self.B = B.broadcast_to(lead + (self.mdim, self.rdim))

    # -- description --------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.A.dtype

    @property
    def device(self) -> torch.device:
        return self.A.device

    @property
    def pair(self) -> Tuple[Float[Tensor, "... ldim mdim"], Float[Tensor, "... mdim rdim"]]:
        return self.A, self.B

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, mdim={self.mdim}, dtype={self.dtype})"

    # -- products -----------------------------------------------------------------------------
    def __matmul__(self, other: Union[Tensor, "FactoredMatrix"]) -> Union["FactoredMatrix", Tensor]:
        """M @ other: a FactoredMatrix for a matrix or FactoredMatrix, a tensor [... ldim] for a vector."""
        if isinstance(other, FactoredMatrix):
            self._check_inner(self.rdim, other.ldim, f"{self!r} @ {other!r}")
            _leading(_shape(self.A)[:-2], _shape(other.A)[:-2], f"{self!r} @ {other!r}")
            return _product(self, other)
        if not isinstance(other, Tensor):
            return NotImplemented
        what = f"{self!r} @ tensor {_shape(other)}"
        if other.ndim == 0:
            raise ValueError(f"{what}: use * for a scalar")
        if other.ndim == 1:
            self._check_inner(self.rdim, other.shape[0], what)
            return (self.A @ (self.B @ other[:, None]))[..., 0]
        self._check_inner(self.rdim, other.shape[-2], what)
        _leading(_shape(self.A)[:-2], _shape(other)[:-2], what)
        if self.rdim > self.mdim:
            return FactoredMatrix(self.A, self.B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: Union[Tensor, "FactoredMatrix"]) -> Union["FactoredMatrix", Tensor]:
        """other @ M: a FactoredMatrix for a matrix, a tensor [... rdim] for a vector."""
        if isinstance(other, FactoredMatrix):
            return other @ self
        if not isinstance(other, Tensor):
            return NotImplemented
        what = f"tensor {_shape(other)} @ {self!r}"
        if other.ndim == 0:
            raise ValueError(f"{what}: use * for a scalar")
        self._check_inner(other.shape[-1], self.ldim, what)
        if other.ndim == 1:
            return ((other[None, :] @ self.A) @ self.B)[..., 0, :]
        _leading(_shape(other)[:-2], _shape(self.A)[:-2], what)
        if self.ldim > self.mdim:
            return FactoredMatrix(other @ self.A, self.B)
        return FactoredMatrix(other, self.AB)

    @staticmethod
    def _check_inner(left: int, right: int, what: str) -> None:
        if left != right:
            raise ArgumentError(f"{what}: inner dims differ ({left} against {right})")

    def __mul__(self, scalar: Union[int, float, Tensor]) -> "FactoredMatrix":
        """M * scalar (a number or a one-element tensor); scales A."""
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float, Tensor)):
            return NotImplemented
        if isinstance(scalar, Tensor):
            if scalar.numel() != 1:
                raise ArgumentError(f"{self!r} * tensor {_shape(scalar)}: * takes a scalar; use @ for a product")
            scalar = scalar.reshape(())
        return FactoredMatrix(self.A * scalar, self.B)

    def __rmul__(self, scalar: Union[int, float, Tensor]) -> "FactoredMatrix":
        return self.__mul__(scalar)

    @property
    def AB(self) -> Float[Tensor, "... ldim rdim"]:
        """M itself, formed: [... ldim rdim] (see the footgun on memory)."""
        return self.A @ self.B

    @property
    def BA(self) -> Float[Tensor, "... mdim mdim"]:
        """B @ A [... mdim mdim]; defined only when M is square (ldim == rdim)."""
        if self.ldim != self.rdim:
            raise ArgumentError(f"BA needs a square matrix (ldim == rdim), this is {self!r}")
        return self.B @ self.A

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    # -- spectra ------------------------------------------------------------------------------
    @cached_property
    def _svd(self) -> Tuple[Float[Tensor, "... ldim k"], Float[Tensor, "... k"], Float[Tensor, "... rdim k"]]:
        U_A, S_A, Vh_A = torch.linalg.svd(_full(self.A), full_matrices=False)
        U_B, S_B, Vh_B = torch.linalg.svd(_full(self.B), full_matrices=False)
        middle = S_A[..., :, None] * (Vh_A @ U_B) * S_B[..., None, :]  # [... k_A k_B]
        U_m, S, Vh_m = torch.linalg.svd(middle, full_matrices=False)
        return U_A @ U_m, S, (Vh_m @ Vh_B).transpose(-2, -1)

    def svd(self) -> Tuple[Float[Tensor, "... ldim k"], Float[Tensor, "... k"], Float[Tensor, "... rdim k"]]:
        """(U, S, V) with M = U diag(S) V^T, k = min(ldim, mdim, rdim), S descending; cached."""
        return self._svd

    @property
    def U(self) -> Float[Tensor, "... ldim k"]:
        return self.svd()[0]

    @property
    def S(self) -> Float[Tensor, "... k"]:
        return self.svd()[1]

    @property
    def V(self) -> Float[Tensor, "... rdim k"]:
        return self.svd()[2]

    @property
    def Vh(self) -> Float[Tensor, "... rdim k"]:
        """TransformerLens's deprecated name for ``V`` (it has always returned V, not V's transpose)."""
        warnings.warn("FactoredMatrix.Vh is V (the right singular vectors), not its transpose: use .V",
                      DeprecationWarning, stacklevel=2)
        return self.V

    @property
    def has_leading_dims(self) -> bool:
        """Whether M has leading dims (either factor had more than two)."""
        return len(self.shape) > 2

    @property
    def eigenvalues(self) -> Complex[Tensor, "... mdim"]:
        """Eigenvalues of BA: if BA v = λ v then AB (A v) = λ (A v), so these are M's nonzero ones."""
        return torch.linalg.eigvals(_full(self.BA))

    def norm(self) -> Float[Tensor, "..."]:
        """Frobenius norm of M, sqrt(sum S^2): [...] (0-d without leading dims)."""
        return self.S.pow(2).sum(-1).sqrt()

    def make_even(self) -> "FactoredMatrix":
        """The same M as (U sqrt(S)) @ (sqrt(S) V^T): both factors carry half of each singular value."""
        root = self.S.sqrt()
        return FactoredMatrix(self.U * root[..., None, :], root[..., :, None] * self.V.transpose(-2, -1))

    def collapse_l(self) -> Float[Tensor, "... k rdim"]:
        """S V^T: M with its left orthogonal factor U removed (M = U @ collapse_l())."""
        return self.S[..., :, None] * self.V.transpose(-2, -1)

    def collapse_r(self) -> Float[Tensor, "... ldim k"]:
        """U S: M with its right orthogonal factor V^T removed (M = collapse_r() @ V^T)."""
        return self.U * self.S[..., None, :]

    # -- shape --------------------------------------------------------------------------------
    def get_corner(self, k: int = 3) -> Float[Tensor, "..."]:
        """M[:k, :k, ..., :k] over every dim, leading ones too, forming only that corner."""
        corner = self.A[..., :k, :] @ self.B[..., :, :k]
        return corner[tuple(slice(k) for _ in range(corner.ndim))]

    def unsqueeze(self, k: int) -> "FactoredMatrix":
        """A new leading dim of size 1 at position k, in [0, ndim - 2] or [-ndim - 1, -3]."""
        n = self.ndim
        if isinstance(k, bool) or not isinstance(k, int) or not (0 <= k <= n - 2 or -n - 1 <= k <= -3):
            raise IndexError(f"unsqueeze({k!r}) on {self!r}: a new leading dim goes at 0..{n - 2} "
                             f"or {-n - 1}..-3, before the two matrix dims")
        return FactoredMatrix(self.A.unsqueeze(k), self.B.unsqueeze(k))

    def __getitem__(self, idx) -> "FactoredMatrix":
        """Index the leading dims; one more entry picks rows, two more rows and columns."""
        entries = idx if isinstance(idx, tuple) else (idx,)
        entries = self._expand_ellipsis(entries, idx)
        n_lead = self.ndim - 2
        lead, matrix = [], []
        for entry in entries:
            if entry is None:
                if matrix:
                    raise IndexError(f"index {idx!r} into {self!r}: None (a new axis) can stand only among "
                                     "the leading indices")
                lead.append(entry)
            elif sum(e is not None for e in lead) < n_lead:
                lead.append(entry)
            else:
                matrix.append(entry)
        if len(matrix) > 2:
            used = sum(e is not None for e in entries)
            raise IndexError(f"index {idx!r} into {self!r} has {used} entries; "
                             f"at most {self.ndim}: {n_lead} leading, then rows and columns")
        try:
            A, B = self.A[tuple(lead)], self.B[tuple(lead)]
            if matrix:
                A = A[..., _matrix_index(matrix[0], self.ldim, "row", idx, self), :]
            if len(matrix) == 2:
                B = B[..., _matrix_index(matrix[1], self.rdim, "column", idx, self)]
        except IndexError as e:
            raise IndexError(f"index {idx!r} into {self!r}: {e}") from None
        return FactoredMatrix(A, B)

    def _expand_ellipsis(self, entries: tuple, idx) -> tuple:
        where = [i for i, entry in enumerate(entries) if entry is Ellipsis]
        if not where:
            return entries
        if len(where) > 1:
            raise IndexError(f"index {idx!r} into {self!r}: at most one ...")
        used = sum(1 for entry in entries if entry is not None and entry is not Ellipsis)
        fill = (slice(None),) * max(self.ndim - used, 0)
        return entries[:where[0]] + fill + entries[where[0] + 1:]


def _matrix_index(entry, size: int, axis: str, idx, matrix: FactoredMatrix):
    """A row or column index as a slice or a 1-d index tensor, so that the dim is kept."""
    if isinstance(entry, Tensor) and entry.ndim == 0 and entry.dtype != torch.bool:
        entry = int(entry)
    if isinstance(entry, slice):
        return entry
    if not isinstance(entry, bool):
        try:
            i = operator.index(entry)
        except TypeError:
            pass
        else:
            if not -size <= i < size:
                raise IndexError(f"{axis} {i} is out of range for {size} {axis}s")
            return slice(i, i + 1 if i != -1 else None)
    try:
        t = torch.as_tensor(entry)
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is None or t.ndim != 1 or t.is_floating_point() or t.is_complex():
        raise IndexError(f"index {idx!r} into {matrix!r}: a {axis} index is an int, a slice or a 1-d sequence "
                         f"of ints (or bools), got {entry!r}")
    return t


def _product(X: FactoredMatrix, Y: FactoredMatrix) -> FactoredMatrix:
    """X @ Y = X.A X.B Y.A Y.B, split at the smallest inner dim: X.mdim, X.rdim (= Y.ldim) or Y.mdim."""
    smallest = min(X.mdim, X.rdim, Y.mdim)
    if X.mdim == smallest:
        return FactoredMatrix(X.A, (X.B @ Y.A) @ Y.B)
    if Y.mdim == smallest:
        return FactoredMatrix(X.A @ (X.B @ Y.A), Y.B)
    return FactoredMatrix(X.AB, Y.AB)
