r"""The paper's QM9 scale estimator, and the decoder density built on it for the -ELBO.

``ScaleEstimator`` is the network of the paper's QM9 appendix table: a representative
``Y: (n, k)`` (flattened) -> [FC -> BatchNorm -> SiLU] x (128, 256, 256, 128) -> FC -> ReLU,
giving one scale sqrt(lam_i) per basis vector, so that ``P = Y diag(sqrt(lam))``.

A point estimate is not a density, so `GramDecoder` turns it into one: a density of the
in-plane Gram matrix ``S = Y^T P P^T Y`` (SPD(k), Lebesgue on the entries i <= j) given the
representative Y, centred on the paper's reconstruction S = diag(s(Y)^2). With the Cholesky
factor ``S = L L^T`` (L lower triangular, positive diagonal),

    log L_ii ~ N(log s_i(Y), tau_i^2),    L_ij ~ N(0, omega_ij^2)   (i > j),

with learned global tau, omega. ``dS = 2^k prod_i L_ii^{k-i+1} dL`` (Muirhead Thm 2.1.9) and
``dL_ii = L_ii d log L_ii`` give

    log p(S | Y) = log N(log diag L) + log N(offdiag L) - k log 2 - sum_i (k - i + 2) log L_ii

(i from 1). The density is not equivariant (``p(Q^T S Q | Y Q) != p(S | Y)``): the paper's
model reads the scales off the basis vectors, which is why its likelihood needs the ELBO
over the orientation Q (`grassflow.distributions.cartesian.cartesian_elbo`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .layers import check_representative, fc_trunk

__all__ = ["GramDecoder", "ScaleEstimator"]


class ScaleEstimator(nn.Module):
    """``Y: (..., n, k)`` -> scales ``sqrt(lam): (..., k)`` (paper's QM9 scale estimator).

    Args:
        n: rows of the representatives ``(..., n, k)`` (QM9 com-free: 18).
        k: their columns (QM9: 3).
        hidden: trunk widths, the paper's ``(128, 256, 256, 128)``.
        norm: ``"batch"`` (the paper's), ``"layer"`` or ``None``.
        init_scale: optional ``(k,)`` typical scales; the output layer starts near them
            (small weights), so no ReLU output starts dead.
        floor: added after the ReLU so that log-scales stay finite.
    """

    def __init__(
        self,
        n: int,
        k: int,
        hidden: Sequence[int] = (128, 256, 256, 128),
        norm: str | None = "batch",
        init_scale: Tensor | None = None,
        floor: float = 1e-3,
    ):
        super().__init__()
        if not 1 <= k < n:
            raise ValueError(f"need 1 <= k < n, got n={n}, k={k}")
        hidden = tuple(hidden)
        self.n, self.k, self.floor = n, k, floor
        self.trunk = fc_trunk(n * k, hidden, norm)
        self.head = nn.Linear(hidden[-1] if hidden else n * k, k)
        with torch.no_grad():
            self.head.weight.mul_(1e-2)
            if init_scale is None:
                self.head.bias.fill_(1.0)
            else:
                if init_scale.shape != (k,) or not (init_scale > 0).all():
                    raise ValueError(f"init_scale must be a positive tensor of shape ({k},)")
                self.head.bias.copy_(init_scale)

    def forward(self, Y: Tensor) -> Tensor:
        check_representative(Y, self.n, self.k)
        out = self.head(self.trunk(Y.reshape(-1, self.n * self.k)))
        return (torch.relu(out) + self.floor).reshape(*Y.shape[:-2], self.k)


class GramDecoder(nn.Module):
    """``p(S | Y)`` on SPD(k) around the scale estimator's ``diag(s(Y)^2)`` (module docstring).

    Args:
        estimator: the `ScaleEstimator`.
        init_tau: initial std of each log L_ii; init_omega: of each L_ij (Å for QM9).
    """

    def __init__(self, estimator: ScaleEstimator, init_tau: float = 0.3, init_omega: float = 1.0):
        super().__init__()
        k = estimator.k
        self.estimator, self.k = estimator, k
        self.log_tau = nn.Parameter(torch.full((k,), math.log(init_tau)))
        self.log_omega = nn.Parameter(torch.full((k * (k - 1) // 2,), math.log(init_omega)))
        self.register_buffer("_tril", torch.tril_indices(k, k, offset=-1), persistent=False)
        # exponent of L_ii in |dS / d(log diag L, offdiag L)|: k - i + 2 for i = 1..k
        self.register_buffer("_power", torch.arange(k + 1, 1, -1.0), persistent=False)

    def log_prob(self, S: Tensor, Y: Tensor) -> Tensor:
        """``log p(S | Y)``; ``S: (..., k, k)`` SPD, ``Y: (..., n, k)`` -> ``(...)``."""
        if S.shape[-2:] != (self.k, self.k):
            raise ValueError(f"S must have shape (..., {self.k}, {self.k}), got {tuple(S.shape)}")
        L = torch.linalg.cholesky(S)
        a = torch.log(torch.diagonal(L, dim1=-2, dim2=-1))
        mu = torch.log(self.estimator(Y))
        tau = self.log_tau.exp()
        lp = (-0.5 * ((a - mu) / tau).square() - self.log_tau).sum(-1)
        if self.k > 1:
            i, j = self._tril
            off = L[..., i, j] / self.log_omega.exp()
            lp = lp + (-0.5 * off.square() - self.log_omega).sum(-1)
        n_coords = self.k * (self.k + 1) // 2
        return (lp - 0.5 * n_coords * math.log(2 * math.pi) - self.k * math.log(2.0)
                - (self._power.to(a) * a).sum(-1))  # fmt: skip

    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``S ~ p(. | Y)``: ``Y: (..., n, k)`` -> ``(..., k, k)``."""
        mu = torch.log(self.estimator(Y))
        noise = torch.randn(mu.shape[:-1] + (self.k * (self.k + 1) // 2,), generator=generator,
                            dtype=mu.dtype, device=mu.device)  # fmt: skip
        L = torch.diag_embed(torch.exp(mu + self.log_tau.exp() * noise[..., : self.k]))
        if self.k > 1:
            i, j = self._tril
            lower = torch.zeros_like(L)
            lower[..., i, j] = self.log_omega.exp() * noise[..., self.k :]
            L = L + lower
        return L @ L.mT

    def forward(self, S: Tensor, Y: Tensor) -> Tensor:
        return self.log_prob(S, Y)
