r"""Learnable conditional density of the ordered eigenvalues lam of P^T P given the subspace.

``EigenvalueDensity`` is a ``scale_log_prob`` for
`grassflow.distributions.cartesian.cartesian_log_prob`: an exactly normalized density of
lam_1 > ... > lam_k > 0 (Lebesgue on the chamber) given the canonical representative
``Y: (n, k)`` of `shape_factor`. Its trunk is the
paper's QM9 "scale estimator" (GrCNF, NeurIPS 2023, QM9 appendix: flattened Y ->
[FC -> BatchNorm -> SiLU] x 4 with widths 128, 256, 256, 128), but the head predicts a
distribution instead of the point estimate sqrt(lam).

Parametrization. The chamber is mapped onto R^k by the log of the smallest eigenvalue and the
logs of the gaps, smallest first,

    z = (log lam_k, log(lam_{k-1} - lam_k), ..., log(lam_1 - lam_2)),
    lam = flip(cumsum(exp(z))),          log |det dlam/dz| = sum_i z_i,

and ``z | Y ~ N(mu(Y), L(Y) L(Y)^T)`` with L lower triangular (positive diagonal). Every z
gives a valid (strictly descending, positive) lam, so sampling needs no rejection and the
density is exact: ``log p(lam | Y) = log N(z; mu, L L^T) - sum_i z_i``. The full Cholesky
factor costs k(k-1)/2 extra outputs (3 for QM9) and lets the overall size and the gaps be
correlated.

Ties. `cartesian_log_prob` divides by
exp(L) ~ prod_{i<j} (lam_i - lam_j), so p(P) is bounded near repeated eigenvalues only if
p(lam | Y) vanishes at least linearly there. With log-gap coordinates, a gap g -> 0 has the
log-normal behaviour p ~ exp(-(log g - m)^2 / (2 s^2)) / g, which vanishes faster than any
power of g, and likewise lam_k -> 0; hence p(P) is bounded (it tends to 0 at ties and at
rank-deficient P) and no explicit tie factor is needed. The flip side: configurations with
(near-)exactly degenerate principal moments (symmetric tops) get a very low density.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .layers import check_representative, fc_trunk

__all__ = ["EigenvalueDensity", "eigenvalues_to_log_gaps", "log_gaps_to_eigenvalues"]


def _check_eigenvalues(lam: Tensor) -> None:
    if not isinstance(lam, Tensor) or not lam.is_floating_point():
        raise ValueError("lam must be a floating-point torch.Tensor")
    if lam.dim() < 1 or lam.numel() == 0:
        raise ValueError(f"lam must be a non-empty (..., k) tensor, got {tuple(lam.shape)}")
    if not torch.isfinite(lam).all():
        raise ValueError("lam contains NaN or inf")
    if (lam <= 0).any():
        raise ValueError("lam must be positive (eigenvalues of P^T P for full-rank P)")
    if (lam[..., 1:] > lam[..., :-1]).any():
        raise ValueError("lam must be sorted in descending order along the last dim")


def eigenvalues_to_log_gaps(lam: Tensor) -> tuple[Tensor, Tensor]:
    """Chamber -> R^k: ``z = (log lam_k, log(lam_{k-1} - lam_k), ..., log(lam_1 - lam_2))``.

    Args:
        lam: ``(..., k)`` positive, descending (ties give ``-inf`` entries).

    Returns:
        z ``(..., k)`` and ``log |det dz/dlam| = -sum_i z_i`` ``(...)``.
    """
    _check_eigenvalues(lam)
    asc = lam.flip(-1)
    # the map (lam_k, gaps) -> lam is unit triangular, so only the logs contribute
    z = torch.log(torch.cat([asc[..., :1], asc.diff(dim=-1)], dim=-1))
    return z, -z.sum(-1)


def log_gaps_to_eigenvalues(z: Tensor) -> Tensor:
    """Inverse of `eigenvalues_to_log_gaps`: ``(..., k)`` -> descending ``lam (..., k)``."""
    return torch.exp(z).cumsum(-1).flip(-1)


class EigenvalueDensity(nn.Module):
    """Conditional density ``p(lam | Y)`` of descending eigenvalues, Gaussian in log-gaps.

    Exact and normalized for every Y (see the module docstring). With ``norm="batch"`` (the
    paper's trunk) the density of one Y depends on the rest of the batch in train mode; call
    ``eval()`` for per-sample exact densities (evaluation, likelihood checks, sampling).

    Args:
        n: rows of Y, shape ``(..., n, k)`` (QM9: 18 or 19).
        k: columns of Y, ``1 <= k < n`` (QM9: 3).
        hidden: widths of the FC trunk; the paper's scale estimator is ``(128, 256, 256, 128)``.
        norm: ``"batch"`` (BatchNorm1d, the paper's), ``"layer"`` (LayerNorm) or ``None``,
            after each hidden FC layer, before SiLU.
        init_mean: optional ``(k,)`` typical log-eigenvalues (descending), e.g. log of the
            training-set medians; the initial mean of z is the z of ``exp(init_mean)``.
            Default: z-mean 0 (lam_k = 1, gaps 1).
        init_std: initial standard deviation of each z coordinate (broad by default: a factor
            e in the smallest eigenvalue and in each gap).

    The head's weights start at 1e-2 of PyTorch's default, so the initial density barely
    depends on Y but gradients still reach the whole trunk.
    """

    def __init__(
        self,
        n: int,
        k: int,
        hidden: Sequence[int] = (128, 256, 256, 128),
        norm: str | None = "batch",
        init_mean: Tensor | None = None,
        init_std: float = 1.0,
    ):
        super().__init__()
        for name, value in (("n", n), ("k", k)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 1 <= k < n:
            raise ValueError(f"need 1 <= k < n, got n={n}, k={k}")
        hidden = tuple(hidden)
        if not (math.isfinite(init_std) and init_std > 0):
            raise ValueError(f"init_std must be finite and positive, got {init_std}")
        self.n, self.k = n, k

        self.trunk = fc_trunk(n * k, hidden, norm)
        width = hidden[-1] if hidden else n * k
        # mean (k), log of the Cholesky diagonal (k), strictly lower Cholesky entries
        self.head = nn.Linear(width, 2 * k + k * (k - 1) // 2)
        self.register_buffer("_tril", torch.tril_indices(k, k, offset=-1), persistent=False)

        mu0 = torch.zeros(k)
        if init_mean is not None:
            if not isinstance(init_mean, Tensor) or init_mean.shape != (k,):
                raise ValueError(f"init_mean must be a tensor of shape ({k},)")
            if not torch.isfinite(init_mean).all() or (init_mean.diff() >= 0).any():
                raise ValueError("init_mean must be finite and strictly descending")
            mu0 = eigenvalues_to_log_gaps(torch.exp(init_mean.detach().double()))[0]
        with torch.no_grad():
            self.head.weight.mul_(1e-2)
            self.head.bias.zero_()
            self.head.bias[:k] = mu0.to(self.head.bias)
            self.head.bias[k : 2 * k] = math.log(init_std)

    def _params(self, Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``Y (..., n, k)`` -> mean ``(..., k)``, log-diag ``(..., k)``, L ``(..., k, k)``."""
        check_representative(Y, self.n, self.k)
        batch, k = Y.shape[:-2], self.k
        # BatchNorm1d wants (N, C): run the trunk on the flattened batch
        out = self.head(self.trunk(Y.reshape(-1, self.n * k))).reshape(*batch, -1)
        mu, log_diag = out[..., :k], out[..., k : 2 * k]
        L = torch.diag_embed(torch.exp(log_diag))
        if k > 1:
            i, j = self._tril
            lower = torch.zeros_like(L)
            lower[..., i, j] = out[..., 2 * k :]
            L = L + lower
        return mu, log_diag, L

    def log_prob(self, lam: Tensor, Y: Tensor) -> Tensor:
        """Exact ``log p(lam | Y)`` w.r.t. Lebesgue measure on lam_1 > ... > lam_k > 0.

        Args:
            lam: ``(..., k)`` positive, descending eigenvalues of P^T P.
            Y: ``(..., n, k)`` canonical representatives; batch shapes broadcast.

        Returns:
            ``(...)``, the broadcast batch shape; ``-inf`` where eigenvalues are tied (the
            density's limit there).
        """
        _check_eigenvalues(lam)
        if lam.shape[-1] != self.k:
            raise ValueError(f"lam must have shape (..., {self.k}), got {tuple(lam.shape)}")
        mu, log_diag, L = self._params(Y)
        try:
            batch = torch.broadcast_shapes(lam.shape[:-1], mu.shape[:-1])
        except RuntimeError as err:
            raise ValueError(f"batch shapes of lam {tuple(lam.shape[:-1])} and Y "
                             f"{tuple(Y.shape[:-2])} do not broadcast") from err  # fmt: skip
        asc = lam.flip(-1)
        parts = torch.cat([asc[..., :1], asc.diff(dim=-1)], dim=-1)
        tied = (parts == 0).any(-1)
        # log(1) at ties keeps gradients finite; the result there is replaced by -inf
        z = torch.log(torch.where(parts == 0, torch.ones_like(parts), parts))
        k = self.k
        diff = (z - mu).expand(*batch, k).unsqueeze(-1)
        eps = torch.linalg.solve_triangular(L.expand(*batch, k, k), diff, upper=False)
        log_normal = (-0.5 * eps.squeeze(-1).square().sum(-1) - log_diag.sum(-1)
                      - 0.5 * k * math.log(2 * math.pi))  # fmt: skip
        lp = log_normal - z.sum(-1)
        return torch.where(tied, torch.full_like(lp, -math.inf), lp)

    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw ``lam ~ p(. | Y)`` (reparametrized, differentiable in the parameters).

        Args:
            Y: ``(..., n, k)`` canonical representatives.
            generator: optional ``torch.Generator`` for the standard normal noise.

        Returns:
            ``(..., k)`` positive, descending eigenvalues.
        """
        mu, _, L = self._params(Y)
        eps = torch.randn(mu.shape, generator=generator, dtype=mu.dtype, device=mu.device)
        z = mu + (L @ eps.unsqueeze(-1)).squeeze(-1)
        return log_gaps_to_eigenvalues(z)

    def forward(self, lam: Tensor, Y: Tensor) -> Tensor:
        """Same as `log_prob`, so the module itself is a ``scale_log_prob`` callable."""
        return self.log_prob(lam, Y)
