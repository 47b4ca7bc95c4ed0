r"""A horizontal vector field on Gr(k, n - 1) from an equivariant velocity field of points: the
``"egnn"`` field of the two-part shape model (`two_part`).

Kept for reproducing the paper's QM9 table and the diagnosis rows; the library's shape model
is one flow on the cloud (`grassflow.flows.ShapeFlow`). Moved here from
``grassflow.nn.horizontal`` in issue 34 (the last library commit with it: 3531f93).

A centred cloud of n points in R^k spans a k-plane of the (n - 1)-dimensional space of
centred coordinates; in the Helmert basis H its representative is ``Y: (n - 1, k)`` with
orthonormal columns, and the rows of ``x = c H Y`` are the cloud whitened by its own second
moment (``x^T x = c^2 I``). An E(k) x S_n-equivariant network ``v(t, x)`` (for example
`grassflow.nn.EGNNField`) gives a velocity of those points; mapped back,
``V = H^T v / c``, and projected onto the horizontal space, ``X = V - Y Y^T V``, it is a
vector field on Gr(k, n - 1):

- ``Y -> Y R`` (R in O(k)) rotates the points, ``x -> x R``, so ``X -> X R``: a horizontal lift;
- relabelling the cloud's points acts on Y by the orthogonal map ``Q = H^T Pi H``, and
  ``X -> Q X``: with a uniform prior the density is invariant to relabelling.

Unlike the gradient of an invariant potential (`grassflow.nn.GrassmannField`),
the field need not be conservative: flow matching's marginal velocity in general is not.
Its divergence is the exact trace by ``k (n - 1 - k)`` forward-mode products
(`grassflow.ode.divergence_exact`, GrCNF's default for fields without a fast path).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from grassflow.manifolds.shape_space import helmert_basis

__all__ = ["PointCloudField"]


class PointCloudField(nn.Module):
    """Horizontal, O(k)-equivariant field ``X(t, Y)`` on Gr(k, n - 1) from a point network.

    Args:
        net: ``v = net(t, x)``, ``x: (..., n, k) -> v: (..., n, k)``, equivariant to rotations,
            reflections and permutations of the points, e.g. ``EGNNField(n, k)``.
        n_points: n.
        scale: c, the whitened points' scale; default ``sqrt(n)`` (unit variance per axis).
    """

    def __init__(self, net: nn.Module, n_points: int, scale: float | None = None):
        super().__init__()
        if not (isinstance(n_points, int) and n_points >= 3):
            raise ValueError(f"n_points must be an integer >= 3, got {n_points!r}")
        self.net, self.n_points = net, n_points
        self.scale = math.sqrt(n_points) if scale is None else float(scale)
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {scale!r}")
        self.register_buffer("H", helmert_basis(n_points), persistent=False)

    def extra_repr(self) -> str:
        return f"n_points={self.n_points}, scale={self.scale:.4g}"

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``t``: scalar time; ``Y: (..., n - 1, k)`` orthonormal -> ``X: (..., n - 1, k)``."""
        if Y.shape[-2] != self.n_points - 1:
            raise ValueError(f"Y must be (..., {self.n_points - 1}, k), got {tuple(Y.shape)}")
        H = self.H.to(Y)
        v = self.net(t, self.scale * (H @ Y))
        V = H.mT @ v / self.scale
        return V - Y @ (Y.mT @ V)
