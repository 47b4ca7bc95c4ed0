r"""The harmonic (bond-graph) prior of a molecule, and the exact law of its span.

A molecule's bond graph with Laplacian L gives the harmonic Gaussian on its centred clouds,
``p(x) ∝ exp(-tr(x^T L x) / (2 s^2))`` (EigenFold; harmonic flow matching, Stärk et al.
2024): bonded atoms start close and the spread grows with the graph distance. On the
CoM-free coordinates ``z = H^T x`` (Helmert basis H) it is ``N(0, s^2 Sigma ⊗ I_d)`` with
``Sigma = (H^T L H)^{-1}`` (`harmonic_covariance`), which exists when the graph is connected.

The span of such a ``z: (m, d)``, ``m = n - 1``, follows the matrix angular central Gaussian
on Gr(d, m) (Chikuse 2003, Thm. 2.4.3), whatever s is:
``p([Y]) = det(Sigma)^{-d/2} det(Y^T Sigma^{-1} Y)^{-m/2} / V_Gr(d, m)``
(`MatrixAngularCentralGaussian`): the prior's Grassmann part in closed form.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

from ..manifolds import Grassmann
from ..manifolds.shape_space import helmert_basis
from .matrix_gaussian import check_covariance

__all__ = ["MatrixAngularCentralGaussian", "bond_laplacian", "harmonic_covariance"]


def bond_laplacian(bonds: Tensor, n: int) -> Tensor:
    """The graph Laplacian ``(n, n)`` float64 of ``bonds: (B, 2)`` on n points."""
    bonds = torch.as_tensor(bonds).long()
    A = torch.zeros(n, n, dtype=torch.float64)
    A[bonds[:, 0], bonds[:, 1]] = A[bonds[:, 1], bonds[:, 0]] = 1.0
    return torch.diag(A.sum(1)) - A


def harmonic_covariance(bonds: Tensor, n: int) -> Tensor:
    """``Sigma = (H^T L H)^{-1}``: ``(n - 1, n - 1)`` float64, the covariance (per coordinate
    axis, before the scale s^2) of the harmonic prior on CoM-free coordinates.

    Raises:
        ValueError: the bond graph is not connected (L's kernel is then more than the
            constant vector, and the prior is not normalizable).
    """
    H = helmert_basis(n)
    P = H.mT @ bond_laplacian(bonds, n) @ H
    lam = torch.linalg.eigvalsh(P)
    if lam[0] <= 1e-9 * lam[-1]:
        parts = int((torch.linalg.eigvalsh(bond_laplacian(bonds, n)) < 1e-9).sum())
        raise ValueError(f"the harmonic prior needs a connected bond graph, but it has {parts} "
                         "components; use prior='gaussian'")  # fmt: skip
    S = torch.cholesky_inverse(torch.linalg.cholesky(P))
    return ((S + S.mT) / 2).contiguous()  # exactly symmetric; torch.kron needs contiguous


class MatrixAngularCentralGaussian(Distribution):
    """MACG(Sigma) on Gr(d, m): the law of the span of ``Z ~ N(0, Sigma ⊗ I_d)``, ``Z: (m, d)``.

    ``log_prob`` is w.r.t. the Riemannian volume of Gr(d, m), like every density in
    grassflow (`UniformGrassmann` is MACG(I)).

    Args:
        Sigma: ``(m, m)`` symmetric positive definite (its scale does not matter).
        d: the subspaces' dimension.
    """

    arg_constraints: dict = {}
    support = constraints.real
    has_rsample = False

    def __init__(self, Sigma: Tensor, d: int):
        m = Sigma.shape[-1] if isinstance(Sigma, Tensor) and Sigma.dim() else 0
        if not (isinstance(d, int) and 1 <= d < m):
            raise ValueError(f"need subspaces of dimension 1 <= d < m = {m}, got d={d!r}")
        self.manifold = Grassmann(d, m)
        self.Sigma = Sigma
        self._chol = check_covariance(Sigma, m, "Sigma")
        self._precision = torch.cholesky_inverse(self._chol)
        logdet = 2 * self._chol.diagonal().log().sum()
        self._const = -0.5 * d * logdet - self.manifold.log_volume()
        super().__init__(torch.Size(), torch.Size((m, d)), validate_args=False)

    def sample(self, sample_shape=torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Orthonormal bases ``(*sample_shape, m, d)`` of the spans of Gaussian draws."""
        shape = (*sample_shape, *self.event_shape)
        eps = torch.randn(shape, dtype=self.Sigma.dtype, generator=generator)
        return torch.linalg.qr(self._chol @ eps.to(self.Sigma.device))[0]

    def log_prob(self, value: Tensor) -> Tensor:
        """``value: (..., m, d)`` orthonormal -> ``(...)``."""
        self.manifold.check_point(value, name="value")
        M = value.mT @ self._precision.to(value) @ value
        return self._const - 0.5 * self.manifold.D * torch.logdet(M)
