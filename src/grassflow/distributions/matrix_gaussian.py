"""The Cayley-retraction matrix-Gaussian prior on Gr(k, D) (paper Prop. 3, Algorithm 1)."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

from ..manifolds import Grassmann

__all__ = ["MatrixGaussianPrior", "check_covariance"]


def check_covariance(C: Tensor, n: int, name: str) -> Tensor:
    """Return the Cholesky factor of ``C: (n, n)``; ``ValueError`` unless symmetric PD."""
    if not isinstance(C, Tensor) or tuple(C.shape) != (n, n):
        shape = tuple(C.shape) if isinstance(C, Tensor) else type(C).__name__
        raise ValueError(f"{name} must be a ({n}, {n}) tensor, got {shape}")
    if not torch.isfinite(C).all():
        raise ValueError(f"{name} contains NaN or inf")
    if not torch.allclose(C, C.mT, rtol=1e-6, atol=1e-10):
        raise ValueError(f"{name} is not symmetric")
    L, info = torch.linalg.cholesky_ex(C)
    if info.item() != 0:
        raise ValueError(f"{name} is not positive definite")
    return L


class MatrixGaussianPrior(Distribution):
    r"""Push-forward of a horizontal matrix Gaussian at M by the Cayley retraction.

    Sampling (Algorithm 1): ``vec(Z) ~ N(0, V (x) U)``, ``xi = (I - M M^T) Z``,
    ``Y = retr_M(xi)``.

    Density, with respect to the Riemannian volume of Gr(k, D) under ``tr(xi^T eta)``
    (the convention of every ``log_prob`` in grassflow):

    $$
    p([X]) = \sum_{\xi:\,[R_M(\xi)] = [X]} \frac{N_h(\xi)}{|\det dR_M(\xi)|}
    $$

    where ``N_h`` is the density of xi on the (D-k)k-dimensional horizontal space at M (a
    matrix normal with row covariance ``M_perp^T U M_perp`` and column covariance V in an
    orthonormal basis M_perp of the complement), and the sum runs over the 2^r Cayley
    preimages (`Grassmann.cayley_preimages`). The paper's Prop. 3 multiplies by the
    Jacobian and keeps only one preimage; a change of variables divides, and the Cayley map
    is 2^r-to-one onto Gr(k, D), so the paper's expression does not integrate to one.

    Singular set (r >= 2). With principal angles theta_i from [M] to [X], the preimages have
    singular values ``s_i = 2 tan(theta_i/2)`` or ``-2 cot(theta_i/2)``, and the Jacobian's pair
    factor ``|1 - s_i^2 s_j^2 / 16|`` vanishes where ``s_i s_j = +-4``: for the mixed preimages
    (one of i, j flipped) exactly where ``theta_i = theta_j``, and for the principal and the
    doubly flipped ones where ``theta_i = theta_j = pi/2``. So p is infinite wherever two of the
    r free principal angles coincide and are positive, e.g. on the subspace farthest from M
    (all theta = pi/2) whenever r >= 2. Near a point where exactly two coincide,
    ``p ~ C / |theta_i - theta_j|`` with C > 0 (``log p + log |theta_i - theta_j|`` has a
    finite limit); where more coincide the pair factors multiply. The Riemannian volume
    vanishes there like ``prod_{i<j} |cos^2 theta_i - cos^2 theta_j|``, so p is integrable (it
    is the density of `rsample`) but ``p^2`` is not: a Monte Carlo estimate of
    ``int p`` from uniform draws has infinite variance. Through the preimages with
    ``s_i^2 + s_j^2 >= 8``, C is at most about ``exp(-4 / sigma^2)`` times the mode's density
    for ``row_cov = sigma^2 I``, ``col_cov = I``: negligible for small sigma, not for sigma ~ 1.
    Equal angles at 0 (in particular the mean itself) are regular, and for r = 1 (k = 1, or
    e.g. Gr(2, 3)) p is bounded. On the singular set `log_prob` returns ``+inf`` or,
    depending on rounding in the pair factor, a large finite value (about ``log(1 / eps)``).

    Gradients (w.r.t. the point, and through it anything upstream such as a flow's parameters)
    are exact wherever p is finite, including the 2k - D principal angles that are always 0
    when 2k > D, the mean itself, and ties between angles on one Cayley branch: the preimages
    are differentiated as smooth functions of ``M^T X``, not through its SVD (see
    `Grassmann.cayley_preimages`). Where a rounded log_prob on the singular set is
    finite, so is the gradient (large there).

    Args:
        manifold: Gr(k, D).
        mean: ``M: (D, k)`` orthonormal, stored as ``loc``; default the first k columns of
            ``I_D``.
        row_cov: ``U: (D, D)`` symmetric positive definite; default ``I_D``.
        col_cov: ``V: (k, k)`` symmetric positive definite; default ``I_k``.
    """

    arg_constraints: dict = {}
    support = constraints.real
    has_rsample = True

    def __init__(
        self,
        manifold: Grassmann,
        mean: Tensor | None = None,
        row_cov: Tensor | None = None,
        col_cov: Tensor | None = None,
    ):
        D, k = manifold.D, manifold.k
        ref = next((x for x in (mean, row_cov, col_cov) if isinstance(x, Tensor)), None)
        dtype = ref.dtype if ref is not None else torch.get_default_dtype()
        device = ref.device if ref is not None else torch.device("cpu")
        for name, x in (("mean", mean), ("row_cov", row_cov), ("col_cov", col_cov)):
            if isinstance(x, Tensor) and (x.dtype != dtype or x.device != device):
                raise ValueError(
                    f"{name} has dtype {x.dtype} on {x.device}, expected {dtype} on {device} "
                    "(mean, row_cov and col_cov must share dtype and device)"
                )
        if mean is None:
            mean = torch.eye(D, k, dtype=dtype, device=device)
        if row_cov is None:
            row_cov = torch.eye(D, dtype=dtype, device=device)
        if col_cov is None:
            col_cov = torch.eye(k, dtype=dtype, device=device)
        if mean.dim() != 2:
            raise ValueError(f"mean must have shape ({D}, {k}), got {tuple(mean.shape)}")
        manifold.check_point(mean, name="mean")
        self.manifold, self.loc, self.row_cov, self.col_cov = manifold, mean, row_cov, col_cov
        self.L_row = check_covariance(row_cov, D, "row_cov")
        self.L_col = check_covariance(col_cov, k, "col_cov")
        # orthonormal basis of span(M)^perp: horizontal vectors are M_perp @ B, B: (D-k, k)
        Q = torch.linalg.qr(torch.cat([mean, torch.eye(D, dtype=dtype, device=device)], -1))[0]
        self.M_perp = Q[:, k:D]
        U_h = self.M_perp.mT @ row_cov @ self.M_perp
        self.L_hrow = check_covariance(U_h, D - k, "row_cov restricted to the horizontal space")
        n = (D - k) * k
        self._log_norm = -0.5 * n * math.log(2 * math.pi) - (
            k * torch.log(torch.diagonal(self.L_hrow)).sum()
            + (D - k) * torch.log(torch.diagonal(self.L_col)).sum()
        )
        super().__init__(torch.Size(), torch.Size((D, k)), validate_args=False)

    def rsample(self, sample_shape=(), generator: torch.Generator | None = None) -> Tensor:
        """Algorithm 1. Returns ``(*sample_shape, D, k)`` orthonormal representatives."""
        D, k = self.manifold.D, self.manifold.k
        E = torch.randn(
            *sample_shape, D, k, generator=generator, dtype=self.loc.dtype, device=self.loc.device
        )
        Z = self.L_row @ E @ self.L_col.mT
        xi = self.manifold.proju(self.loc, Z)
        return self.manifold.retr(self.loc.expand_as(xi), xi)

    def sample(self, sample_shape=(), generator: torch.Generator | None = None) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)

    def horizontal_log_prob(self, xi: Tensor) -> Tensor:
        """log N_h(xi) for horizontal ``xi: (..., D, k)`` at the mean. ``(...)``."""
        B = self.M_perp.mT @ xi
        A = torch.linalg.solve_triangular(self.L_hrow, B, upper=False)
        A = torch.linalg.solve_triangular(self.L_col, A.mT, upper=False)
        return self._log_norm - 0.5 * A.square().sum(dim=(-2, -1))

    def log_prob(self, value: Tensor) -> Tensor:
        """Exact log-density of ``[value]``, ``value: (..., D, k)`` -> ``(...)``."""
        self.manifold.check_point(value, name="value")
        if value.dtype != self.loc.dtype or value.device != self.loc.device:
            raise ValueError(
                f"value has dtype {value.dtype} on {value.device}, but the prior is "
                f"{self.loc.dtype} on {self.loc.device}"
            )
        return self.log_prob_unchecked(value)

    def log_prob_unchecked(self, value: Tensor) -> Tensor:
        """``log_prob`` without input checks (for use inside solvers and training loops)."""
        xis, s, valid = self.manifold.cayley_preimages(self.loc.expand_as(value), value)
        terms = self.horizontal_log_prob(xis) - Grassmann.cayley_log_jacobian(s, self.manifold.D)
        terms = torch.where(valid, terms, torch.full_like(terms, -math.inf))
        return torch.logsumexp(terms, dim=0)
