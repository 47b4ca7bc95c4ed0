"""Maximum mean discrepancy between two samples on Gr(k, D).

The kernel is a Gaussian of the squared chordal (projection) distance,

    ``kappa([X], [Y]) = exp(-d_c^2 / (2 h^2))``,
    ``d_c^2 = k - ||X^T Y||_F^2 = ||XX^T - YY^T||_F^2 / 2``.

It depends on X only through the projector ``XX^T``, so it does not care which
orthonormal representative is passed (``X -> XQ`` for Q in O(k), ``y -> -y`` for k = 1),
and it is a Gaussian RBF kernel on the embedding ``[X] -> XX^T`` in R^{D x D}, hence
positive definite.

References:
    Gretton, Borgwardt, Rasch, Schoelkopf, Smola. A Kernel Two-Sample Test (JMLR 2012).
    Hamm, Lee. Grassmann Discriminant Analysis (ICML 2008), projection kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..manifolds import Grassmann

__all__ = ["median_bandwidth", "mmd2", "pairwise_chordal_dist2"]


def _check_pair(X: Tensor, Y: Tensor) -> None:
    for name, Z in (("X", X), ("Y", Y)):
        if not isinstance(Z, Tensor) or Z.dim() != 3:
            shape = tuple(Z.shape) if isinstance(Z, Tensor) else type(Z).__name__
            raise ValueError(f"{name} must be a tensor of shape (n, D, k), got {shape}")
    if X.shape[1:] != Y.shape[1:]:
        raise ValueError(
            "X and Y must be points of the same Gr(k, D): "
            f"got {tuple(X.shape)} and {tuple(Y.shape)}"
        )
    if X.dtype != Y.dtype or X.device != Y.device:
        raise ValueError(f"X is {X.dtype} on {X.device} but Y is {Y.dtype} on {Y.device}")
    D, k = X.shape[1:]
    gr = Grassmann(int(k), int(D))
    gr.check_point(X, name="X")
    gr.check_point(Y, name="Y")


def pairwise_chordal_dist2(X: Tensor, Y: Tensor) -> Tensor:
    """Squared chordal distances ``k - ||X_i^T Y_j||_F^2`` between all pairs.

    Args:
        X: ``(n, D, k)`` orthonormal representatives.
        Y: ``(m, D, k)`` orthonormal representatives.

    Returns:
        ``(n, m)``, clamped at 0 against round-off.
    """
    k = X.shape[-1]
    G = torch.einsum("ndk,mdl->nmkl", X, Y)  # (n, m, k, k) = X_i^T Y_j
    return (k - G.square().sum(dim=(-2, -1))).clamp_min(0)


def median_bandwidth(X: Tensor, Y: Tensor | None = None) -> Tensor:
    """Median heuristic: the median chordal distance over distinct pairs of the pooled sample.

    Args:
        X: ``(n, D, k)``.
        Y: optional ``(m, D, k)``, pooled with X.

    Returns:
        0-dim tensor ``h`` (the lower median for an even number of pairs); 1.0 if the median
        is 0, which only happens when most points coincide.
    """
    Z = X if Y is None else torch.cat([X, Y], 0)
    if Z.shape[0] < 2:
        raise ValueError(f"the median heuristic needs at least 2 points, got {Z.shape[0]}")
    i, j = torch.triu_indices(Z.shape[0], Z.shape[0], offset=1, device=Z.device)
    h = pairwise_chordal_dist2(Z, Z)[i, j].sqrt().median().detach()
    return torch.where(h > 0, h, torch.ones_like(h))


def mmd2(X: Tensor, Y: Tensor, bandwidth: float | Tensor | None = None) -> Tensor:
    """Unbiased estimate of the squared MMD between the laws of X and Y on Gr(k, D).

    ``MMD^2_u = sum_{i != i'} K(X_i, X_i') / (n(n-1)) + sum_{j != j'} K(Y_j, Y_j') / (m(m-1))
    - 2 sum_{i, j} K(X_i, Y_j) / (nm)`` (Gretton et al. 2012, eq. 3). It is centred on the
    true MMD^2, so it can be slightly negative when the two laws are equal.

    Args:
        X: ``(n, D, k)`` orthonormal representatives, n >= 2.
        Y: ``(m, D, k)`` orthonormal representatives, m >= 2.
        bandwidth: kernel width h > 0; default `median_bandwidth` of X and Y pooled.

    Returns:
        0-dim tensor in the dtype of the inputs; differentiable in X and Y (the default
        bandwidth is treated as a constant).
    """
    _check_pair(X, Y)
    n, m = X.shape[0], Y.shape[0]
    if n < 2 or m < 2:
        raise ValueError(f"the unbiased MMD needs at least 2 points per sample, got {n} and {m}")
    if bandwidth is None:
        h = median_bandwidth(X, Y)
    else:
        h = torch.as_tensor(bandwidth, dtype=X.dtype, device=X.device)
        if h.dim() != 0 or not (torch.isfinite(h) and h > 0):
            raise ValueError(f"bandwidth must be a positive finite scalar, got {bandwidth!r}")
    gamma = 0.5 / h.square()
    Kxx = torch.exp(-gamma * pairwise_chordal_dist2(X, X))
    Kyy = torch.exp(-gamma * pairwise_chordal_dist2(Y, Y))
    Kxy = torch.exp(-gamma * pairwise_chordal_dist2(X, Y))
    xx = (Kxx.sum() - Kxx.diagonal().sum()) / (n * (n - 1))
    yy = (Kyy.sum() - Kyy.diagonal().sum()) / (m * (m - 1))
    return xx + yy - 2.0 * Kxy.mean()
