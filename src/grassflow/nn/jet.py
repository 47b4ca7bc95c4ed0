r"""Forward-mode Laplacian: value, directional derivatives and summed second derivatives in
one forward pass.

A `Jet` of a quantity f(Y) holds, at the current Y and for directions
``E_1 .. E_m`` of the input,

* ``v``: the value f, shape ``S``;
* ``J``: the first directional derivatives ``D f[E_a]``, shape ``(m, *S)``;
* ``L``: the summed second directional derivatives ``sum_{a < n_lap} D^2 f[E_a, E_a]``, ``S``.

Only the first ``n_lap`` directions enter L; the others (e.g. the direction Y itself, for the
``tr(Y^T grad v)`` term of the Laplace-Beltrami operator) carry first derivatives only.
Propagation is exact: linear maps act on J and L alike; a smooth elementwise f gives
``L' = f'(x) L + f''(x) sum_a J_a^2``; a product gives
``L' = a L_b + L_a b + 2 sum_a J_a(a) J_a(b)``. ``J = None`` or ``L = None`` stands for zero.

Layers written with the functions of this module (`linear`, `tanh`,
`silu`, `cat`, `stack`) and with tensor operators (``+ - * @``, ``.mT``,
``.mean(dim)``, ...) run unchanged on tensors and on jets, so a network is written once.
Jet methods take negative dims only, because J has the extra leading direction axis.

References:
    Li et al. A computational framework for neural network-based variational Monte Carlo with
    Forward Laplacian (Nature Machine Intelligence 2024), arXiv:2307.08214.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Jet", "cat", "linear", "silu", "silu_derivatives", "stack", "tanh"]


def _dim(dim: int) -> int:
    if dim >= 0:
        raise ValueError(f"Jet operations take negative dims (J has a leading axis), got {dim}")
    return dim


def _pad(J: Tensor, rank: int) -> Tensor:
    """Align ``J: (m, *s)`` with a result of ``rank`` dims (right-aligned broadcasting)."""
    missing = rank - (J.dim() - 1)
    return J if missing <= 0 else J.reshape(J.shape[0], *(1,) * missing, *J.shape[1:])


def _add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


class Jet:
    """Value ``v: S``, derivatives ``J: (m, *S)`` and Laplacian ``L: S`` (see module docs).

    Args:
        v: the value.
        J: first derivatives along the m directions (None: all zero).
        L: summed second derivatives along the first ``n_lap`` directions (None: zero).
        n_lap: how many leading directions count in L.
    """

    __slots__ = ("J", "L", "n_lap", "v")

    def __init__(self, v: Tensor, J: Tensor | None, L: Tensor | None, n_lap: int):
        self.v, self.J, self.L, self.n_lap = v, J, L, n_lap

    @classmethod
    def input(cls, Y: Tensor, directions: Tensor, n_lap: int) -> Jet:
        """The jet of the identity at ``Y: S`` along ``directions: (m, *S)``."""
        return cls(Y, directions, None, n_lap)

    # ----------------------------------------------------------------- helpers
    @property
    def dtype(self) -> torch.dtype:
        return self.v.dtype

    @property
    def device(self) -> torch.device:
        return self.v.device

    @property
    def shape(self) -> torch.Size:
        return self.v.shape

    def dim(self) -> int:
        return self.v.dim()

    def _new(self, v: Tensor, J: Tensor | None, L: Tensor | None) -> Jet:
        """A jet with value v; J and L broadcast to v's shape (after adding a larger tensor)."""
        if J is not None:
            J = _pad(J, v.dim())
            J = J if J.shape[1:] == v.shape else J.expand(J.shape[0], *v.shape)
        if L is not None and L.shape != v.shape:
            L = L.expand(v.shape)
        return Jet(v, J, L, self.n_lap)

    def _map(self, fn, rank: int = 0) -> Jet:
        """A linear map without offset applied to v, J and L (shape ops, reductions, products
        with constants of ``rank`` dims)."""
        J = None if self.J is None else fn(_pad(self.J, rank))
        return self._new(fn(self.v), J, None if self.L is None else fn(self.L))

    # ------------------------------------------------------------ shape ops
    @property
    def mT(self) -> Jet:
        return self._map(lambda x: x.mT)

    def flatten(self, start_dim: int, end_dim: int = -1) -> Jet:
        return self._map(lambda x: x.flatten(_dim(start_dim), _dim(end_dim)))

    def unsqueeze(self, dim: int) -> Jet:
        return self._map(lambda x: x.unsqueeze(_dim(dim)))

    def squeeze(self, dim: int) -> Jet:
        return self._map(lambda x: x.squeeze(_dim(dim)))

    def diagonal(self, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Jet:
        """As ``Tensor.diagonal``, but with negative dims (pass them as keywords in layers
        written for both, since the tensor's defaults are 0 and 1)."""
        return self._map(lambda x: x.diagonal(offset, _dim(dim1), _dim(dim2)))

    def mean(self, dim: int) -> Jet:
        return self._map(lambda x: x.mean(dim=_dim(dim)))

    def sum(self, dim: int) -> Jet:
        return self._map(lambda x: x.sum(dim=_dim(dim)))

    # ------------------------------------------------------------ arithmetic
    def __neg__(self) -> Jet:
        return self._map(torch.neg)

    def __add__(self, other) -> Jet:
        if isinstance(other, Jet):
            rank = max(self.dim(), other.dim())
            J = _add(*(None if x.J is None else _pad(x.J, rank) for x in (self, other)))
            return self._new(self.v + other.v, J, _add(self.L, other.L))
        return self._new(self.v + other, self.J, self.L)

    __radd__ = __add__

    def __sub__(self, other) -> Jet:
        return self + (-other)

    def __rsub__(self, other) -> Jet:
        return (-self) + other

    def __mul__(self, other) -> Jet:
        if isinstance(other, Jet):
            return self._product(other, torch.mul)
        return self._map(lambda x: x * other, torch.as_tensor(other).dim())

    __rmul__ = __mul__

    def __matmul__(self, other) -> Jet:
        if isinstance(other, Jet):
            return self._product(other, torch.matmul)
        return self._map(lambda x: x @ other, other.dim())

    def __rmatmul__(self, other: Tensor) -> Jet:
        return self._map(lambda x: other @ x, other.dim())

    def _product(self, other: Jet, op) -> Jet:
        """A bilinear ``op``: ``L = op(L_a, b) + op(a, L_b) + 2 sum_a op(J_a, J_b)``."""
        rank = max(self.dim(), other.dim())
        Ja = None if self.J is None else _pad(self.J, rank)
        Jb = None if other.J is None else _pad(other.J, rank)
        left, right, cross = _BILINEAR[op]
        J = _add(None if Ja is None else left(Ja, other.v),
                 None if Jb is None else right(self.v, Jb))  # fmt: skip
        L = _add(None if self.L is None else op(self.L, other.v),
                 None if other.L is None else op(self.v, other.L))  # fmt: skip
        if Ja is not None and Jb is not None:
            L = _add(L, 2 * cross(Ja[: self.n_lap], Jb[: self.n_lap]))
        return self._new(op(self.v, other.v), J, L)

    def elementwise(self, f: Tensor, df: Tensor, d2f: Tensor) -> Jet:
        """The jet of ``f(x)`` given ``f, f', f''`` evaluated at ``x = self.v``."""
        if self.J is None:
            return self._new(f, None, None)
        sq = self.J[: self.n_lap].square().sum(0)
        L = d2f * sq if self.L is None else df * self.L + d2f * sq
        return self._new(f, df * self.J, L)


# (J_a b, a J_b, sum_a J_a(a) J_a(b)) per bilinear op; for matmul, einsum folds the direction
# axis into the rows (or the contraction) instead of batching many tiny products
_BILINEAR = {
    torch.mul: (torch.mul, torch.mul, lambda Ja, Jb: (Ja * Jb).sum(0)),
    torch.matmul: (
        lambda J, b: torch.einsum("m...ij,...jk->m...ik", J, b),
        lambda a, J: torch.einsum("...ij,m...jk->m...ik", a, J),
        lambda Ja, Jb: torch.einsum("m...ij,m...jk->...ik", Ja, Jb),
    ),
}


# ------------------------------------------------------------------ functions
def linear(x: Tensor | Jet, weight: Tensor, bias: Tensor | None = None) -> Tensor | Jet:
    """``x W^T + b`` on tensors or jets (the offset b touches the value only)."""
    if not isinstance(x, Jet):
        return torch.nn.functional.linear(x, weight, bias)
    out = x._map(lambda z: z @ weight.mT)
    return out if bias is None else out + bias


def tanh(x: Tensor | Jet) -> Tensor | Jet:
    if not isinstance(x, Jet):
        return torch.tanh(x)
    f = torch.tanh(x.v)
    df = 1 - f.square()
    return x.elementwise(f, df, -2 * f * df)


def silu_derivatives(z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``silu(z) = z sigmoid(z)`` and its first two derivatives,
    ``f' = s (1 + z (1 - s))`` and ``f'' = s (1 - s) (2 + z (1 - 2 s))``."""
    s = torch.sigmoid(z)
    ds = s * (1 - s)
    return z * s, s + z * ds, ds * (2 + z * (1 - 2 * s))


def silu(x: Tensor | Jet) -> Tensor | Jet:
    if not isinstance(x, Jet):
        return torch.nn.functional.silu(x)
    return x.elementwise(*silu_derivatives(x.v))


def _as_jet(x: Tensor | Jet, like: Jet) -> Jet:
    return x if isinstance(x, Jet) else Jet(x, None, None, like.n_lap)


def _join(xs, dim: int, fn) -> Tensor | Jet:
    """``torch.cat``/``torch.stack`` over tensors and jets; constants get zero derivatives."""
    jets = [x for x in xs if isinstance(x, Jet)]
    if not jets:
        return fn(xs, dim=dim)
    ref = jets[0]
    xs = [_as_jet(x, ref) for x in xs]
    m = next((x.J.shape[0] for x in xs if x.J is not None), None)
    v = fn([x.v for x in xs], dim=_dim(dim))

    def zeros_J(x: Jet) -> Tensor:
        return x.J if x.J is not None else x.v.new_zeros(1).expand(m, *x.v.shape)

    J = None if m is None else fn([zeros_J(x) for x in xs], dim=dim)
    L = None
    if any(x.L is not None for x in xs):
        L = fn([torch.zeros_like(x.v) if x.L is None else x.L for x in xs], dim=dim)
    return Jet(v, J, L, ref.n_lap)


def cat(xs, dim: int) -> Tensor | Jet:
    """``torch.cat`` of tensors and jets (negative ``dim`` when any is a jet)."""
    return _join(xs, dim, torch.cat)


def stack(xs, dim: int) -> Tensor | Jet:
    """``torch.stack`` of tensors and jets (negative ``dim`` when any is a jet)."""
    return _join(xs, dim, torch.stack)
