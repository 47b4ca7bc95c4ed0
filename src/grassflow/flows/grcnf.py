"""GrCNF: a continuous normalizing flow on Gr(k, D) (paper §4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..distributions import MatrixGaussianPrior, UniformGrassmann
from ..manifolds import Grassmann
from ..nn import GrassmannField
from ..ode import METHODS, divergence_exact, divergence_hutchinson, odeint_grassmann

__all__ = ["GrCNF"]


class GrCNF(nn.Module):
    r"""Continuous normalizing flow on Gr(k, D).

    A prior sample Y_0 is transported by the ODE ``dY/dt = X(t, Y)`` to ``Y_T``; the density is

    $$
    \log p(Y_T) = \log p_0(Y_0) - \int_0^T \operatorname{div} X(t, Y_t)\,dt
    $$

    with the Riemannian divergence on Gr(k, D). Internally time is rescaled to s = t / T in
    [0, 1] so that the end time T can be learned (FFJORD's ``train_T``).

    Args:
        manifold: Gr(k, D).
        field: horizontal, O(k)-equivariant vector field module ``X(t, Y)``; default the paper's
            potential-gradient field with the ``textures`` widths.
        prior: ``"gaussian"`` (the Cayley matrix-Gaussian prior) or ``"uniform"``.
        prior_mean: mean of the Gaussian prior (default ``I_{D,k}``); the prior's parameters
            are stored as buffers so they follow ``.to()``.
        row_cov: row covariance of the Gaussian prior (default ``sigma^2 I_D``).
        col_cov: column covariance of the Gaussian prior (default ``I_k``).
        sigma: prior scale used when ``row_cov`` is None (paper: 0.3).
        T: end time; ``train_T=True`` learns it as ``T = s^2`` with ``s`` a parameter.
        divergence: ``"exact"`` or ``"hutchinson"`` during training; evaluation (``eval()`` mode)
            always uses the exact divergence unless ``log_prob(..., exact=False)``.
        method: ODE method, ``"cayley_rkmk"`` (intrinsic), ``"ambient"`` (projection) or
            ``"kronecker"`` (the paper's chart solver with Kronecker Jacobians; slow reference).
        atol: absolute solver tolerance (paper: 1e-5).
        rtol: relative solver tolerance (paper: 1e-5).
        adjoint: adjoint gradients (only for ``method="ambient"``).

    References:
        Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation.
        NeurIPS 2023, arXiv:2211.02900.
    """

    def __init__(
        self,
        manifold: Grassmann,
        field: nn.Module | None = None,
        *,
        prior: str = "gaussian",
        prior_mean: Tensor | None = None,
        row_cov: Tensor | None = None,
        col_cov: Tensor | None = None,
        sigma: float = 0.3,
        T: float = 1.0,
        train_T: bool = True,
        divergence: str = "exact",
        method: str = "cayley_rkmk",
        atol: float = 1e-5,
        rtol: float = 1e-5,
        adjoint: bool = False,
    ):
        super().__init__()
        D, k = manifold.D, manifold.k
        if prior not in ("gaussian", "uniform"):
            raise ValueError(f"prior must be 'gaussian' or 'uniform', got {prior!r}")
        if divergence not in ("exact", "hutchinson"):
            raise ValueError(f"divergence must be 'exact' or 'hutchinson', got {divergence!r}")
        if not (math.isfinite(T) and T > 0):
            raise ValueError(f"end time T must be positive and finite, got {T}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"prior scale sigma must be positive, got {sigma}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if adjoint and method != "ambient":
            raise ValueError("adjoint=True is only available with method='ambient'")
        if not (atol > 0 and rtol > 0):
            raise ValueError(f"atol and rtol must be positive, got atol={atol}, rtol={rtol}")
        if field is not None and not isinstance(field, nn.Module):
            raise ValueError(f"field must be an nn.Module, got {type(field).__name__}")
        self.manifold = manifold
        self.field = GrassmannField.from_preset(D, k) if field is None else field
        self.prior_kind = prior
        mean = torch.eye(D, k) if prior_mean is None else prior_mean
        row = sigma**2 * torch.eye(D) if row_cov is None else row_cov
        col = torch.eye(k) if col_cov is None else col_cov
        if prior == "gaussian":
            MatrixGaussianPrior(manifold, mean, row, col)  # validate once, early
        self.register_buffer("prior_mean", mean.clone())
        self.register_buffer("row_cov", row.clone())
        self.register_buffer("col_cov", col.clone())
        sqrt_T = torch.tensor(math.sqrt(T))
        if train_T:
            self.sqrt_T = nn.Parameter(sqrt_T)
        else:
            self.register_buffer("sqrt_T", sqrt_T)
        self.divergence, self.method = divergence, method
        self.atol, self.rtol, self.adjoint = atol, rtol, adjoint
        self.last_stats: dict = {}

    @property
    def T(self) -> Tensor:
        return self.sqrt_T.square()

    @property
    def dtype(self) -> torch.dtype:
        """The flow's floating dtype (that of its buffers; inputs must match it)."""
        return self.prior_mean.dtype

    @property
    def device(self) -> torch.device:
        """The flow's device (``train`` may have moved it, e.g. with ``device="auto"``)."""
        return self.prior_mean.device

    def extra_repr(self) -> str:
        return (
            f"prior={self.prior_kind!r}, T={self.T.item():.4g}, divergence={self.divergence!r}, "
            f"method={self.method!r}, atol={self.atol:g}, rtol={self.rtol:g}"
        )

    # ------------------------------------------------------------------ prior
    def prior(self) -> MatrixGaussianPrior | UniformGrassmann:
        """The base distribution on the module's dtype and device."""
        if self.prior_kind == "uniform":
            return UniformGrassmann(self.manifold, self.dtype, self.device)
        return MatrixGaussianPrior(self.manifold, self.prior_mean, self.row_cov, self.col_cov)

    def _prior_log_prob(self, Y: Tensor) -> Tensor:
        return self.prior().log_prob_unchecked(Y)

    # --------------------------------------------------------------- dynamics
    def _dynamics(self, sign: float, divergence: str | None, Y_like: Tensor):
        """ODE right-hand side in rescaled time s: ``(T X(sT, Y), sign * T div X)``, with the
        ``"exact"`` or ``"hutchinson"`` divergence; ``divergence=None``: transport only (the
        divergence part is zero)."""
        T = self.T.to(Y_like)
        hutchinson = divergence == "hutchinson"
        noise = torch.randn_like(Y_like) if hutchinson else None  # fixed per solve (FFJORD)
        create_graph = torch.is_grad_enabled()
        fast = getattr(self.field, "field_and_divergence", None)

        def dynamics(s: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
            t = s * T
            if divergence is None:
                return T * self.field(t, Y), Y.new_zeros(Y.shape[:-2])
            if fast is not None:
                X, div = fast(t, Y, noise, create_graph=create_graph)
            elif not hutchinson:
                X, div = divergence_exact(lambda Z: self.field(t, Z), Y)
            else:
                X, div = divergence_hutchinson(lambda Z: self.field(t, Z), Y, noise)
            return T * X, (sign * T) * div

        return dynamics

    def _solve(
        self, Y: Tensor, a: Tensor, s0: float, s1: float, sign: float, divergence: str | None
    ):
        """Solve from s0 to s1 carrying ``a`` (``divergence`` as in `_dynamics`)."""
        dynamics = self._dynamics(sign, divergence, Y)
        Y1, a1, stats = odeint_grassmann(
            dynamics,
            Y,
            a,
            s0,
            s1,
            method=self.method,
            atol=self.atol,
            rtol=self.rtol,
            adjoint=self.adjoint,
            adjoint_params=tuple(self.parameters()) if self.adjoint else None,
        )
        if divergence is not None and hasattr(self.field, "last_path"):
            stats["divergence_path"] = self.field.last_path
        self.last_stats = stats
        return Y1, a1

    def _divergence(self, exact: bool | None) -> str:
        """The divergence a density uses: ``exact`` True/False forces ``"exact"`` /
        ``"hutchinson"``; None (the public default) means exact in ``eval()`` mode and the
        ``divergence`` setting in ``train()`` mode."""
        if exact is None:
            exact = self.divergence == "exact" or not self.training
        return "exact" if exact else "hutchinson"

    def _check(self, Y: Tensor, name: str) -> None:
        """Shape, then dtype and device (metadata, so no values are read from a wrong device),
        then finiteness and orthonormality at the tolerance of the flow's dtype."""
        self.manifold.check_shape(Y, name)
        ref = self.prior_mean
        if Y.dtype != ref.dtype or Y.device != ref.device:
            raise ValueError(
                f"{name} has dtype {Y.dtype} on {Y.device}, but the flow is {ref.dtype} on "
                f"{ref.device}; convert with .to() first (shape {tuple(Y.shape)})"
            )
        self.manifold.check_point(Y, name=name)

    # ----------------------------------------------------------- public API
    def transport_forward(self, Y0: Tensor) -> Tensor:
        """Push prior-side points ``Y0: (B, D, k)`` to data side (t = 0 -> T)."""
        self._check(Y0, "Y0")
        return self._solve(Y0, Y0.new_zeros(Y0.shape[:-2]), 0.0, 1.0, 1.0, None)[0]

    def transport_backward(self, Y1: Tensor) -> Tensor:
        """Pull data-side points ``Y1: (B, D, k)`` back to the prior side (t = T -> 0)."""
        self._check(Y1, "Y1")
        return self._solve(Y1, Y1.new_zeros(Y1.shape[:-2]), 1.0, 0.0, 1.0, None)[0]

    def log_prob(self, Y: Tensor, exact: bool | None = None) -> Tensor:
        """Exact (or Hutchinson) log-density of ``[Y]``, ``Y: (B, D, k)`` -> ``(B,)``.

        Works under ``torch.no_grad()`` (no graph is kept; the divergence still uses autograd
        internally).

        Args:
            Y: orthonormal representatives; any representative gives the same value.
            exact: force the exact (True) or stochastic (False) divergence; default exact in
                ``eval()`` mode and the ``divergence`` setting in ``train()`` mode.
        """
        self._check(Y, "Y")
        # a(s) with a(1) = 0 and da/ds = T div  =>  a(0) = -int_0^T div dt
        Y0, a0 = self._solve(Y, Y.new_zeros(Y.shape[:-2]), 1.0, 0.0, 1.0, self._divergence(exact))
        return self._prior_log_prob(Y0) + a0

    def forward(self, Y: Tensor) -> Tensor:
        """Alias of `log_prob`."""
        return self.log_prob(Y)

    def sample_prior(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"number of samples must be an integer >= 1, got {n!r}")
        return self.prior().sample((n,), generator=generator)

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` samples ``(n, D, k)`` (no divergence is integrated)."""
        Y0 = self.sample_prior(n, generator)
        return self._solve(Y0, Y0.new_zeros(n), 0.0, 1.0, 1.0, None)[0]

    def sample_with_log_prob(
        self, n: int, generator: torch.Generator | None = None, exact: bool | None = None
    ) -> tuple[Tensor, Tensor]:
        """Samples ``(n, D, k)`` and their log-densities ``(n,)`` in one forward solve."""
        Y0 = self.sample_prior(n, generator)
        a0 = self._prior_log_prob(Y0)
        return self._solve(Y0, a0, 0.0, 1.0, -1.0, self._divergence(exact))
