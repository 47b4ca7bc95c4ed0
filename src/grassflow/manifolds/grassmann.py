"""The Grassmann manifold Gr(k, D) as the quotient St(k, D) / O(k).

A point [Y] is stored as an orthonormal representative ``Y: (..., D, k)``; every
method accepts any representative and is batched over the leading dimensions.
Tangent vectors at [Y] are stored as horizontal lifts ``xi: (..., D, k)`` with
``Y^T xi = 0``. The metric is the quotient metric ``<xi, eta> = tr(xi^T eta)``.

References:
    Absil, Mahony, Sepulchre. Optimization Algorithms on Matrix Manifolds (2008).
    Edelman, Arias, Smith. The geometry of algorithms with orthogonality constraints (1998).
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), Appendix A.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .shape_space import full_rank, span_basis

__all__ = ["Grassmann", "orthonormality_error"]


def _default_atol(dtype: torch.dtype) -> float:
    # loose enough for data orthonormalized in float32, tight enough to catch real mistakes
    return max(1e-7, 1e3 * torch.finfo(dtype).eps)


def orthonormality_error(Y: Tensor) -> Tensor:
    """Largest entry of ``|Y^T Y - I|`` per point. ``Y: (..., D, k)`` -> ``(...)``."""
    eye = torch.eye(Y.shape[-1], dtype=Y.dtype, device=Y.device)
    return (Y.mT @ Y - eye).abs().amax(dim=(-2, -1))


def _sym(A: Tensor) -> Tensor:
    return 0.5 * (A + A.mT)


def _cayley_divided_differences(c: Tensor, e: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """Divided differences of the Cayley factors ``h_i = 2 e_i / d_i``, ``d_i = 1 + e_i c_i``.

    ``delta_ij = (h_i - h_j) / (c_i - c_j)``, ``h'(c_i) = -2 / d_i^2`` on the diagonal, and
    ``sigma_ij = (h_i + h_j) / (c_i + c_j)``, in closed form (no cancellation):
    ``delta = 2 ((e_i - e_j) / (c_i - c_j) - e_i e_j) / (d_i d_j)``,
    ``sigma = 2 ((e_i + e_j) / (c_i + c_j) + e_i e_j) / (d_i d_j)``. The first quotients are 0 for
    branches that make them regular and infinite only on the singular set, where their
    denominators are kept at least eps away from 0.

    Args:
        c: ``(..., k)`` cosines; e: ``(2^r, ..., k)`` branch signs +-1; d: ``(2^r, ..., k)``.

    Returns:
        delta, sigma ``(2^r, ..., k, k)``.
    """
    tiny = torch.finfo(c.dtype).eps

    def away_from_zero(x: Tensor) -> Tensor:
        return torch.copysign(x.abs().clamp_min(tiny), x)

    ci, cj = c.unsqueeze(-1), c.unsqueeze(-2)
    ei, ej = e.unsqueeze(-1), e.unsqueeze(-2)
    dd = d.unsqueeze(-1) * d.unsqueeze(-2)
    delta = 2.0 * ((ei - ej) / away_from_zero(ci - cj) - ei * ej) / dd
    sigma = 2.0 * ((ei + ej) / away_from_zero(ci + cj) + ei * ej) / dd
    return delta, sigma


class Grassmann(nn.Module):
    """Gr(k, D): k-dimensional linear subspaces of R^D.

    Args:
        k: subspace dimension, ``1 <= k < D``.
        D: ambient dimension.

    Example:
        >>> gr = Grassmann(2, 4)
        >>> Y = gr.random(10)                 # (10, 4, 2), Haar distributed
        >>> xi = gr.proju(Y, torch.randn(10, 4, 2))
        >>> X = gr.retr(Y, xi)
        >>> Q = torch.linalg.qr(torch.randn(2, 2))[0]  # any rotation or reflection
        >>> bool(gr.same_subspace(gr.retr(Y @ Q, xi @ Q), X).all())
        True
    """

    def __init__(self, k: int, D: int):
        super().__init__()
        if not (isinstance(k, int) and isinstance(D, int)):
            raise ValueError(f"k and D must be integers, got k={k!r}, D={D!r}")
        if not 1 <= k < D:
            raise ValueError(f"Gr(k, D) needs 1 <= k < D, got k={k}, D={D}")
        self.k, self.D = k, D

    def extra_repr(self) -> str:
        return f"k={self.k}, D={self.D}"

    @property
    def dim(self) -> int:
        """Manifold dimension k(D - k)."""
        return self.k * (self.D - self.k)

    # ------------------------------------------------------------------ checks
    def check_shape(self, Y: Tensor, name: str = "Y") -> None:
        """Raise ``ValueError`` unless ``Y`` is a floating tensor of shape ``(..., D, k)``."""
        if not isinstance(Y, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(Y).__name__}")
        if not Y.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {Y.dtype}")
        if Y.dim() < 2 or tuple(Y.shape[-2:]) != (self.D, self.k):
            raise ValueError(
                f"{name} must have shape (..., {self.D}, {self.k}) for Gr({self.k}, {self.D}), "
                f"got {tuple(Y.shape)}"
            )
        if Y.numel() == 0:
            raise ValueError(f"{name} is an empty batch (shape {tuple(Y.shape)})")

    def check_point(self, Y: Tensor, atol: float | None = None, name: str = "Y") -> None:
        """Raise ``ValueError`` unless ``Y: (..., D, k)`` is finite and orthonormal.

        Args:
            Y: candidate representatives.
            atol: tolerance on ``max |Y^T Y - I|``; default ``max(1e-7, 1000 eps)``.
        """
        self.check_shape(Y, name)
        if not torch.isfinite(Y).all():
            raise ValueError(f"{name} contains NaN or inf")
        atol = _default_atol(Y.dtype) if atol is None else atol
        err = orthonormality_error(Y).max().item()
        if err > atol:
            raise ValueError(
                f"{name} is not orthonormal: max |Y^T Y - I| = {err:.3g} > atol = {atol:.3g}; "
                "use Grassmann.projx or from_point_cloud to orthonormalize"
            )

    # ---------------------------------------------------------------- basics
    def random(
        self,
        *batch: int,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Haar-uniform points ``(*batch, D, k)``: QR of a Gaussian with sign-fixed R."""
        G = torch.randn(*batch, self.D, self.k, generator=generator, dtype=dtype, device=device)
        Q, R = torch.linalg.qr(G)
        sign = torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        return Q * sign.unsqueeze(-2)

    def inner(self, Y: Tensor, u: Tensor, v: Tensor | None = None) -> Tensor:
        """Quotient metric ``tr(u^T v)``. ``u, v: (..., D, k)`` -> ``(...)``."""
        v = u if v is None else v
        return (u * v).sum(dim=(-2, -1))

    def norm(self, Y: Tensor, u: Tensor) -> Tensor:
        return self.inner(Y, u).clamp_min(0).sqrt()

    def proju(self, Y: Tensor, Z: Tensor) -> Tensor:
        """Projection of ``Z: (..., D, k)`` onto the horizontal space at Y: ``(I - Y Y^T) Z``."""
        return Z - Y @ (Y.mT @ Z)

    egrad2rgrad = proju

    def projx(self, Z: Tensor) -> Tensor:
        """Closest orthonormal matrix (polar factor ``U V^T`` of ``Z: (..., D, k)``).

        Equivariant: ``projx(Z Q) = projx(Z) Q`` for ``Q`` in O(k).
        """
        U, _, Vh = torch.linalg.svd(Z, full_matrices=False)
        return U @ Vh

    # ----------------------------------------------------------- retraction
    def retr(self, Y: Tensor, xi: Tensor) -> Tensor:
        """Cayley horizontal retraction, economy form at t = 1 (paper eq. 37 / Alg. 1).

        ``R_Y(xi) = Y + xi - (Y/2 + xi/4) (I + xi^T xi / 4)^{-1} xi^T xi``.
        Equal to ``expmap`` with each singular value s of xi replaced by ``2 arctan(s/2)``.

        Args:
            Y: ``(..., D, k)`` representative.
            xi: ``(..., D, k)`` horizontal vector at Y.

        Returns:
            ``(..., D, k)`` orthonormal representative.
        """
        H = xi.mT @ xi
        eye = torch.eye(self.k, dtype=Y.dtype, device=Y.device)
        GH = torch.linalg.solve(eye + 0.25 * H, H)
        return Y + xi - (0.5 * Y + 0.25 * xi) @ GH

    def inv_retr(self, Y: Tensor, X: Tensor) -> Tensor:
        """The paper's inverse retraction ``2 (X - Y Y^T X)(I + Y^T X)^{-1}`` (eq. 38).

        It inverts ``retr`` on the retraction's image, ``inv_retr(Y, retr(Y, xi)) = xi``, but it
        depends on the representative X of [X] (for k > 1 ``inv_retr(Y, X Q)`` is not a preimage
        of [X]). For a representative-free answer use `cayley_preimages`.
        """
        eye = torch.eye(self.k, dtype=Y.dtype, device=Y.device)
        N = eye + Y.mT @ X
        return 2.0 * torch.linalg.solve(N.mT, self.proju(Y, X).mT).mT

    def principal_decomposition(self, Y: Tensor, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Principal angles and vectors from [Y] to [X].

        With ``Y^T X = A cos(theta) B^T`` (SVD) the columns of ``X B`` are
        ``Y A cos(theta) + W``, where ``W = (I - Y Y^T) X B`` has orthogonal columns of norm
        ``sin(theta)``.

        Returns:
            theta ``(..., k)`` in [0, pi/2], ascending; W ``(..., D, k)``; A ``(..., k, k)``.
        """
        A, c, Bh = torch.linalg.svd(Y.mT @ X)
        W = self.proju(Y, X @ Bh.mT)
        s = W.norm(dim=-2)
        theta = torch.atan2(s, c.clamp(0.0, 1.0))
        return theta, W, A

    def cayley_preimages(self, Y: Tensor, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """All horizontal xi at Y with ``[retr(Y, xi)] = [X]``.

        With principal angles theta_i the preimages are ``U diag(s) V^T`` with
        ``s_i in {2 tan(theta_i/2), -2 cot(theta_i/2)}``. Angles that are forced to zero when
        2k > D (the subspaces intersect) only have the first option, so there are 2^r preimages,
        ``r = min(k, D - k)``. Index 0 is the principal one (all ``s_i >= 0``).

        Gradients. With ``C = Y^T X = A diag(c) B^T`` (c = cos theta) each preimage is
        ``xi = (I - Y Y^T) X G(C)``, ``G = B diag(h(c)) A^T``, ``h = 2 / (1 + c)`` on the first
        branch and ``-2 / (1 - c)`` on the second. G is smooth in C even where singular values
        repeat (the 2k - D forced zero angles, or [X] = [Y]), but autograd through the SVD divides
        by ``c_i - c_j = 0`` there and returns NaN. So the SVD runs without autograd and G gets
        its closed-form derivative: with ``P = A^T dC B``,
        ``B^T dG A = delta o sym(P) - sigma o skew(P)``, ``delta_ij = (h_i - h_j) / (c_i - c_j)``
        (``h'(c_i)`` on the diagonal) and ``sigma_ij = (h_i + h_j) / (c_i + c_j)``, both rational
        in c (`_cayley_divided_differences`); s gets ``dc_i = P_ii``, which is exact for
        functions of s^2 (the Jacobian). Only on the prior's singular set (equal c on different
        branches, or two angles of pi/2) is a divided difference infinite; there it is capped
        and the gradient is large but finite. Second derivatives are not provided.

        Returns:
            xi ``(2^r, ..., D, k)``, representative-independent; s ``(2^r, ..., k)`` the signed
            singular values; valid ``(2^r, ...)``, False where a second-branch angle is so small
            (``sin(theta/2) < 1e4 eps``) that its preimage lies at numerical infinity. Such
            entries are finite but meaningless; their density contribution is zero.
        """
        r = min(self.k, self.D - self.k)
        thr = 1e4 * torch.finfo(Y.dtype).eps
        flips = torch.tensor(
            [[False] * (self.k - r) + [bool(m >> i & 1) for i in range(r)] for m in range(2**r)],
            device=Y.device,
        ).reshape((2**r,) + (1,) * (Y.dim() - 2) + (self.k,))
        C = Y.mT @ X
        X_perp = X - Y @ C
        with torch.no_grad():  # values only; the gradient is attached below
            A, c, Bh = torch.linalg.svd(C)
            W = self.proju(Y, X @ Bh.mT)  # as principal_decomposition
            theta = torch.atan2(W.norm(dim=-2), c.clamp(0.0, 1.0))
            half = 0.5 * theta
            sin_h = torch.sin(half)
            sin_hc = sin_h.clamp_min(thr)
            # h = s / sin(theta) for both branches, written to stay finite
            plus, minus = 1.0 / torch.cos(half).square(), -1.0 / sin_hc.square()
            s_plus, s_minus = 2.0 * torch.tan(half), -2.0 * torch.cos(half) / sin_hc
            h = torch.where(flips, minus, plus)
            s = torch.where(flips, s_minus, s_plus)
            valid = ~(flips & (sin_h < thr)).any(-1)
            G = (Bh.mT * h.unsqueeze(-2)) @ A.mT  # (2^r, ..., k, k)
        if torch.is_grad_enabled() and (Y.requires_grad or X.requires_grad):
            # e = +-1 per branch, d = 1 + e c (= 2 sin^2(theta/2) on the second branch, clamped
            # as sin_hc is), so that h = 2 e / d
            e = torch.where(flips, -1.0, 1.0).to(c)
            d = (1.0 + e * c).clamp_min(2.0 * thr**2)
            delta, sigma = _cayley_divided_differences(c, e, d)
            P = A.mT @ C @ Bh.mT  # diag(c) in value; carries A^T dC B
            sym = _sym(P)
            skew = P - sym
            dG = Bh.mT @ (delta * sym - sigma * skew) @ A.mT
            G = G + (dG - dG.detach())
            # ds/dc = 2 (d mu / dc) / s with mu = s^2 / 4 = 2 / d - 1; exact for functions of s^2
            ds_dc = torch.where(s == 0, 0.0, -4.0 * e / (d.square() * torch.where(s == 0, 1.0, s)))
            dc = torch.diagonal(P, dim1=-2, dim2=-1)
            s = s + ds_dc * (dc - dc.detach())
        return X_perp @ G, s, valid

    @staticmethod
    def cayley_log_jacobian(sigma: Tensor, D: int) -> Tensor:
        """``log |det d[retr_Y](xi)|`` for singular values ``sigma: (..., k)`` of xi.

        Volume change from the horizontal space (Lebesgue) to Gr(k, D) (Riemannian volume):
        ``prod_i (1 + s_i^2/4)^{-(D-1)} prod_{i<j} |1 - s_i^2 s_j^2 / 16|``. Derived from the
        exponential map's Jacobian (roots e_i +- e_j, e_i with multiplicity |D - 2k|) composed
        with the reparametrization ``theta = 2 arctan(s/2)``.
        """
        s2 = sigma.square() / 4.0
        out = -(D - 1) * torch.log1p(s2).sum(-1)
        k = sigma.shape[-1]
        if k > 1:
            i, j = torch.triu_indices(k, k, offset=1, device=sigma.device)
            out = out + torch.log(torch.abs(1.0 - s2[..., i] * s2[..., j])).sum(-1)
        return out

    # ------------------------------------------------------ exp, log, dist
    def expmap(self, Y: Tensor, xi: Tensor) -> Tensor:
        """Riemannian exponential ``(Y V cos S + U sin S) V^T`` for ``xi = U S V^T``."""
        U, S, Vh = torch.linalg.svd(xi, full_matrices=False)
        V = Vh.mT
        out = (Y @ V) * torch.cos(S).unsqueeze(-2) + U * torch.sin(S).unsqueeze(-2)
        # re-orthonormalize: cheap and keeps long chains of expmaps on the manifold
        return self.projx(out @ Vh)

    def logmap(self, Y: Tensor, X: Tensor) -> Tensor:
        """Riemannian logarithm: the horizontal xi at Y of smallest norm with exp_Y(xi) = [X].

        Representative-independent in X; at the cut locus (an angle of pi/2) one of the
        minimizing geodesics is returned. Returns ``(..., D, k)``.
        """
        theta, W, A = self.principal_decomposition(Y, X)
        # theta / sin(theta), smooth at 0
        scale = 1.0 / torch.sinc(theta / math.pi)
        return (W * scale.unsqueeze(-2)) @ A.mT

    def geodesic(self, Y0: Tensor, Y1: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """Point and velocity of the geodesic ``Y_t = exp_{Y0}(t log_{Y0}(Y1))``.

        With ``log_{Y0}(Y1) = U diag(theta) V^T``:
        ``Y_t = (Y0 V cos(t theta) + U sin(t theta)) V^T`` and
        ``dY_t/dt = (-Y0 V theta sin(t theta) + U theta cos(t theta)) V^T``, which is horizontal
        at Y_t. Written with ``W = U sin(theta)`` so that small angles and the cut locus
        (theta = pi/2, where one of the minimizing geodesics is taken) stay finite.

        Args:
            Y0: ``(..., D, k)`` start; Y_t is a representative continuing Y0 (``Y_0 = Y0``).
            Y1: ``(..., D, k)`` end; only ``[Y1]`` matters.
            t: ``(...)`` times in [0, 1].

        Returns:
            ``Y_t: (..., D, k)`` and ``u_t = dY_t/dt: (..., D, k)``.
        """
        theta, W, A = self.principal_decomposition(Y0, Y1)
        t = t.unsqueeze(-1)
        tt = t * theta
        sinc = torch.sinc(theta / math.pi)  # sin(theta) / theta
        Y0A = Y0 @ A
        sin_ratio = t * torch.sinc(tt / math.pi) / sinc  # sin(t theta) / sin(theta)
        Yt = Y0A * torch.cos(tt).unsqueeze(-2) + W * sin_ratio.unsqueeze(-2)
        ut = -Y0A * (theta * torch.sin(tt)).unsqueeze(-2) + W * (torch.cos(tt) / sinc).unsqueeze(-2)
        return Yt @ A.mT, ut @ A.mT

    def principal_angles(self, Y: Tensor, X: Tensor) -> Tensor:
        """Principal angles ``(..., k)`` in [0, pi/2], ascending."""
        return self.principal_decomposition(Y, X)[0]

    def dist(self, Y: Tensor, X: Tensor) -> Tensor:
        """Geodesic distance ``||theta||_2`` (arc-length). ``(...)``."""
        return self.principal_angles(Y, X).norm(dim=-1)

    def chordal_dist2(self, Y: Tensor, X: Tensor) -> Tensor:
        """Squared chordal (projection) distance ``k - ||Y^T X||_F^2 = sum sin^2 theta``."""
        return (self.k - (Y.mT @ X).square().sum(dim=(-2, -1))).clamp_min(0)

    def same_subspace(self, X: Tensor, Y: Tensor, atol: float | None = None) -> Tensor:
        """Whether ``span(X) == span(Y)`` up to ``atol`` on ``||(I - Y Y^T) X||_F``. ``(...)``."""
        atol = _default_atol(X.dtype) * 10 if atol is None else atol
        return self.proju(Y, X).norm(dim=(-2, -1)) <= atol

    # ---------------------------------------------------------------- volume
    def log_volume(self) -> float:
        """log V_Gr(k, D) = (k(D-k)/2) log pi + log Gamma_k(k/2) - log Gamma_k(D/2).

        The Riemannian volume under the metric tr(xi^T eta) (paper eq. 35); Gr(1, 3) = 2 pi.
        """
        return (
            0.5 * self.k * (self.D - self.k) * math.log(math.pi)
            + _mvlgamma(0.5 * self.k, self.k)
            - _mvlgamma(0.5 * self.D, self.k)
        )

    # ---------------------------------------------------------- data helper
    def from_point_cloud(
        self, P: Tensor, method: str = "qr", return_factor: bool = False, rtol: float = 1e-6
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Orthonormal basis of the column span of a point cloud ``P: (..., D, k)``.

        Rows of P are the D points, columns the k coordinates (so Gr(3, 13) for LJ13).

        Args:
            P: ``(..., D, k)`` point clouds (centre them first if required).
            method: ``"qr"``: Gram-Schmidt of the columns (R with positive diagonal; paper's
                DW4/LJ13 protocol). ``"eig"``: ``P P^T = Y Lambda Y^T`` with Lambda descending
                (paper's QM9 protocol); column signs are fixed so that the largest-magnitude
                entry of each column is positive.
            return_factor: also return ``B = Y^T P: (..., k, k)``, so that ``P = Y B``.
            rtol: a configuration whose k-th singular value is below ``rtol`` times its first
                has rank < k and raises ``ValueError``.
        """
        self.check_shape(P, "P")
        if not torch.isfinite(P).all():
            raise ValueError("P contains NaN or inf")
        bad = ~full_rank(torch.linalg.svdvals(P), rtol)
        if bad.any():
            n = int(bad.sum())
            raise ValueError(
                f"{n} point cloud(s) have rank < {self.k} (e.g. collinear points) and cannot be "
                f"orthonormalized; first at batch index {tuple(bad.nonzero()[0].tolist())}"
            )
        Y = span_basis(P, method)
        if return_factor:
            return Y, Y.mT @ P
        return Y


def _mvlgamma(a: float, p: int) -> float:
    """log of the multivariate gamma function Gamma_p(a)."""
    return 0.25 * p * (p - 1) * math.log(math.pi) + sum(math.lgamma(a - 0.5 * j) for j in range(p))
