"""An O(k)-equivariant log-normal density on symmetric positive definite matrices.

``S = L exp(E) L^T`` with ``L L^T = M`` (the centre) and E a Gaussian on Sym(k) invariant
under ``E -> Q^T E Q``: standard deviation ``sigma_0`` (Frobenius) on the traceless part and
``sigma_t`` along the trace direction ``I / sqrt(k)``. Because E's law is O(k)-invariant, the
density of S depends on M alone, not on which square root L is used (a Cholesky factor here),
and ``p(Q^T S Q; Q^T M Q) = p(S; M)``. It is a function of the eigenvalues of ``M^-1 S`` only,
so it needs no eigenvectors (whose gradients blow up at the near-degenerate spectra of round
clouds). Densities are with respect to Lebesgue measure on the entries ``i <= j``, as
`wishart_log_prob`'s.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "log_det_dexp", "spd_log", "spd_lognormal_log_prob", "spd_lognormal_precision_log_prob",
    "spd_lognormal_precision_sample", "spd_lognormal_sample", "sym_coords", "sym_from_coords",
]  # fmt: skip


def _log_sinhc(u: Tensor) -> Tensor:
    """``log(sinh(u) / u)``, stable for small and large ``|u|``."""
    a = u.abs()
    small = a < 1e-3
    safe = torch.where(small, torch.ones_like(a), a)
    big = safe + torch.log1p(-torch.exp(-2 * safe)) - math.log(2) - torch.log(safe)
    return torch.where(small, a * a / 6, big)


def _gaussian_log_prob(lam: Tensor, sigma_0: Tensor, sigma_t: Tensor) -> Tensor:
    """Log-density of E (eigenvalues ``lam: (..., k)``) under the invariant Gaussian."""
    k = lam.shape[-1]
    m = k * (k + 1) // 2
    tr = lam.sum(-1)
    quad = ((lam * lam).sum(-1) - tr * tr / k) / sigma_0**2 + tr * tr / (k * sigma_t**2)
    # Frobenius-orthonormal coordinates are (E_ii, sqrt(2) E_ij): a factor 2^(k(k-1)/4)
    return (-0.5 * m * math.log(2 * math.pi) - torch.log(sigma_t) - (m - 1) * torch.log(sigma_0)
            + 0.25 * k * (k - 1) * math.log(2) - 0.5 * quad)  # fmt: skip


def log_det_dexp(lam: Tensor) -> Tensor:
    """``log det`` of the differential of ``exp`` on Sym(k) at E with eigenvalues ``lam``:
    ``sum_i lam_i + sum_{i<j} log((e^lam_i - e^lam_j) / (lam_i - lam_j))``."""
    k = lam.shape[-1]
    i, j = torch.triu_indices(k, k, 1, device=lam.device)
    li, lj = lam[..., i], lam[..., j]
    return lam.sum(-1) + ((li + lj) / 2 + _log_sinhc((li - lj) / 2)).sum(-1)


def spd_lognormal_log_prob(S: Tensor, M: Tensor, sigma_0: Tensor, sigma_t: Tensor) -> Tensor:
    """``log p(S)`` of ``S = L exp(E) L^T``, ``L L^T = M``.

    Args:
        S: ``(..., k, k)`` SPD.
        M: ``(..., k, k)`` SPD centre (the geometric mean of S).
        sigma_0: ``(...)`` positive standard deviation of E's traceless part.
        sigma_t: ``(...)`` positive standard deviation of E's trace direction.

    Returns:
        ``(...)``.
    """
    k = S.shape[-1]
    L = torch.linalg.cholesky(M)
    A = torch.linalg.solve_triangular(L, S, upper=False)
    A = torch.linalg.solve_triangular(L, A.mT, upper=False)  # L^-1 S L^-T (symmetric)
    lam = torch.log(torch.linalg.eigvalsh((A + A.mT) / 2))
    log_det_M = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)
    return (_gaussian_log_prob(lam, sigma_0, sigma_t) - log_det_dexp(lam)
            - 0.5 * (k + 1) * log_det_M)  # fmt: skip


def spd_lognormal_sample(
    M: Tensor, sigma_0: Tensor, sigma_t: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """One S per centre ``M: (..., k, k)``; ``sigma_0, sigma_t: (...)``."""
    k = M.shape[-1]
    Z = torch.randn(M.shape, dtype=M.dtype, device=M.device, generator=generator)
    E = (Z + Z.mT) / 2 * sigma_0[..., None, None]  # Frobenius-isotropic, std sigma_0
    tr = torch.diagonal(E, dim1=-2, dim2=-1).sum(-1)
    eye = torch.eye(k, dtype=M.dtype, device=M.device)
    E = E + ((sigma_t / sigma_0 - 1) * tr / k)[..., None, None] * eye
    lam, V = torch.linalg.eigh(E)
    L = torch.linalg.cholesky(M)
    A = (V * lam.exp().unsqueeze(-2)) @ V.mT
    return L @ A @ L.mT


class _SPDLog(torch.autograd.Function):
    """``log A`` of SPD ``A`` with the Daleckii-Krein backward: divided differences of log,
    ``1 / mu`` in the limit, so the gradient stays finite at (near-)equal eigenvalues, where a
    model that fits S well puts ``A = L^-1 S L^-T`` (close to I)."""

    @staticmethod
    def forward(ctx, A):
        mu, V = torch.linalg.eigh(A)
        ctx.save_for_backward(mu, V)
        return (V * mu.log().unsqueeze(-2)) @ V.mT

    @staticmethod
    def backward(ctx, G):
        mu, V = ctx.saved_tensors
        mi, mj = mu.unsqueeze(-1), mu.unsqueeze(-2)
        diff = mi - mj
        close = diff.abs() <= 1e-6 * mi
        D = torch.where(close, 2 / (mi + mj), (mi.log() - mj.log()) / torch.where(close, 1, diff))
        Gs = V.mT @ ((G + G.mT) / 2) @ V
        return V @ (Gs * D) @ V.mT


def spd_log(A: Tensor) -> Tensor:
    """``log A: (..., k, k)`` of SPD ``A``, with a backward that stays finite at equal
    eigenvalues (see `_SPDLog`)."""
    return _SPDLog.apply((A + A.mT) / 2)


def sym_from_coords(e: Tensor, k: int) -> Tensor:
    """Inverse of `sym_coords`: ``(..., k(k+1)/2) -> (..., k, k)`` symmetric."""
    a, b = torch.triu_indices(k, k, device=e.device)
    vals = e / torch.where(a == b, 1.0, math.sqrt(2)).to(e)
    E = e.new_zeros(*e.shape[:-1], k, k)
    E[..., a, b] = vals
    E[..., b, a] = vals
    return E


def sym_coords(E: Tensor) -> Tensor:
    """``(..., k, k)`` symmetric -> ``(..., k(k+1)/2)`` Frobenius-orthonormal coordinates
    ``(E_ii, sqrt(2) E_ij for i < j)``, in ``torch.triu_indices`` order."""
    k = E.shape[-1]
    a, b = torch.triu_indices(k, k, device=E.device)
    return E[..., a, b] * torch.where(a == b, 1.0, math.sqrt(2)).to(E)


def spd_lognormal_precision_log_prob(S: Tensor, L: Tensor, precision: Tensor) -> Tensor:
    """``log p(S)`` of ``S = L exp(E) L^T`` with ``sym_coords(E) ~ N(0, precision^-1)``.

    Unlike `spd_lognormal_log_prob`, E's law may be anisotropic; it is then the caller's
    job to build ``precision`` from ``L`` so that the density does not depend on which square
    root of ``M = L L^T`` is used (e.g. from ``L^T d`` for vectors d that rotate with S).

    Args:
        S: ``(..., k, k)`` SPD.
        L: ``(..., k, k)`` lower triangular, invertible.
        precision: ``(..., m, m)`` SPD, ``m = k(k+1)/2``.

    Returns:
        ``(...)``.
    """
    k = S.shape[-1]
    m = k * (k + 1) // 2
    A = torch.linalg.solve_triangular(L, S, upper=False)
    A = torch.linalg.solve_triangular(L, A.mT, upper=False)
    E = spd_log(A)
    chol = torch.linalg.cholesky(precision)
    z = (chol.mT @ sym_coords(E).unsqueeze(-1)).squeeze(-1)  # e^T P e = |C^T e|^2
    log_det_P = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    log_det_L = torch.log(torch.diagonal(L, dim1=-2, dim2=-1).abs()).sum(-1)
    return (-0.5 * m * math.log(2 * math.pi) + 0.5 * log_det_P - 0.5 * (z * z).sum(-1)
            + 0.25 * k * (k - 1) * math.log(2) - log_det_dexp(torch.linalg.eigvalsh(E))
            - (k + 1) * log_det_L)  # fmt: skip


def spd_lognormal_precision_sample(
    L: Tensor, precision: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """One S per ``L: (..., k, k)`` and ``precision: (..., m, m)`` (see
    `spd_lognormal_precision_log_prob`)."""
    k = L.shape[-1]
    chol = torch.linalg.cholesky(precision)
    z = torch.randn(precision.shape[:-1], dtype=L.dtype, device=L.device, generator=generator)
    e = torch.linalg.solve_triangular(chol.mT, z.unsqueeze(-1), upper=True).squeeze(-1)
    lam, V = torch.linalg.eigh(sym_from_coords(e, k))
    return L @ ((V * lam.exp().unsqueeze(-2)) @ V.mT) @ L.mT
