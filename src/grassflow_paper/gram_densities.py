"""The Gram densities of the two-part shape model: the conditional density of a cloud's
in-span Gram matrix given its subspace.

Kept for reproducing the paper's QM9 table and the diagnosis rows (`two_part`); the library's
shape model is one flow on the cloud (`grassflow.flows.ShapeFlow`). Moved here from
``grassflow.nn.gram`` in issue 34 (the last library commit with it: 3531f93).

A centred cloud in Helmert coordinates is ``P' = Y B`` with ``[Y]`` in Gr(k, n - 1); what the
subspace does not say is the Gram matrix ``S = B B^T = Y^T P' P'^T Y`` (the cloud's extent and
the orientation of its principal axes inside [Y]). `WishartGram` models ``S`` given Y
exactly and equivariantly, so that with a Grassmann density it gives an exact density on the
centred coordinates (`grassflow.distributions.cartesian.cartesian_log_prob_gram`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from grassflow.distributions.cartesian import wishart_log_prob, wishart_sample
from grassflow.distributions.spd import (
    spd_lognormal_precision_log_prob,
    spd_lognormal_precision_sample,
    sym_coords,
)
from grassflow.nn.graph import PointGraph

__all__ = ["DistanceGram", "WishartGram", "metric_fit"]


def metric_fit(d: Tensor, w: Tensor, t: Tensor) -> Tensor:
    """The symmetric S minimizing ``sum_p w_p (d_p^T S d_p - t_p)^2``.

    Args:
        d: ``(..., P, k)`` difference vectors; w, t: ``(..., P)`` weights and targets.

    Returns:
        ``(..., k, k)`` (not necessarily positive definite), from the normal equations in the
        k(k+1)/2 entries ``i <= j`` (a relative ridge of 1e-9 keeps them solvable).
    """
    k = d.shape[-1]
    a, b = torch.triu_indices(k, k, device=d.device)
    phi = d[..., a] * d[..., b] * torch.where(a == b, 1.0, 2.0).to(d)  # (..., P, m)
    normal = (phi.mT * w.unsqueeze(-2)) @ phi
    rhs = ((w * t).unsqueeze(-2) @ phi).squeeze(-2)
    ridge = 1e-9 * normal.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None]
    s = torch.linalg.solve(normal + ridge * torch.eye(len(a), dtype=d.dtype, device=d.device), rhs)
    S = d.new_zeros(*s.shape[:-1], k, k)
    S[..., a, b] = s
    S[..., b, a] = s
    return S


def _draw_component(log_pi: Tensor, generator: torch.Generator | None) -> Tensor:
    """One mixture component per row of ``log_pi: (..., C)`` -> ``(..., 1)`` long. With one
    component nothing is drawn, so the generator's stream is the same as without a mixture."""
    if log_pi.shape[-1] == 1:
        return torch.zeros_like(log_pi, dtype=torch.long)
    c = torch.multinomial(log_pi.exp().reshape(-1, log_pi.shape[-1]), 1, generator=generator)
    return c.reshape(*log_pi.shape[:-1], 1)


class WishartGram(nn.Module):
    """``S | Y ~ Wishart_k(nu(Y), Sigma(Y) / nu(Y))``, so ``E[S | Y] = Sigma(Y)``, with

        ``Sigma(Y) = sum_i w_i(Y) y~_i y~_i^T``,  ``nu(Y) = k - 1 + exp(a(Y))``,

    or a mixture of ``components`` such Wisharts with invariant weights ``pi_c(Y)`` (a cloud's
    extent can be multimodal, e.g. DW4's double-well pair distances),

    where ``y~_i`` are the rows of ``Y~ = H Y`` (the points in Y's frame) and the weights
    ``w_i > 0`` and the pooled ``a`` are invariant functions of the cloud's Gram matrix
    (a `PointGraph`). Since ``Y -> Y Q`` sends ``y~_i -> Q^T y~_i``,
    ``Sigma(Y Q) = Q^T Sigma(Y) Q`` and the density is equivariant, as the Gram form of the
    Cartesian density requires; relabelling the points permutes the ``w_i`` with them, so it
    is also permutation invariant. ``Sigma >= min_i w_i * I`` because ``sum_i y~_i y~_i^T =
    Y^T Y = I``.

    Args:
        n_points: n, points per cloud (Gr(k, n - 1)).
        k: the points' dimension (clouds in R^k).
        hidden: width of the `PointGraph`.
        layers: message-passing layers of the `PointGraph`.
        labels: optional ``(n,)`` integer point labels of the `PointGraph`.
        log_scale: initial ``log w_i`` (all equal at initialization, so ``Sigma = e^log_scale
            I``); set it from the data with `initialize`.
        dof: initial degrees of freedom ``nu``.
        components: mixture components; their initial scales spread over a factor e^2
            around ``log_scale``.
    """

    def __init__(
        self,
        n_points: int,
        k: int,
        hidden: int = 32,
        layers: int = 1,
        labels: Tensor | None = None,
        log_scale: float = 0.0,
        dof: float = 20.0,
        components: int = 1,
    ):
        super().__init__()
        if not dof > k - 1:
            raise ValueError(f"dof must be > k - 1 = {k - 1}, got {dof}")
        if not (isinstance(components, int) and components >= 1):
            raise ValueError(f"components must be a positive integer, got {components!r}")
        self.k, self.components = k, components
        self.graph = PointGraph(n_points, k, hidden, layers, labels)
        self.weight = nn.Linear(hidden, components)
        self.log_dof = nn.Linear(hidden, components)
        # mixture logits (absent for one component, so single-Wishart checkpoints load)
        self.logits = nn.Linear(hidden, components) if components > 1 else None
        for layer in (self.weight, self.log_dof, self.logits):
            if layer is not None:
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)
        self._set_scale(log_scale)
        nn.init.constant_(self.log_dof.bias, math.log(dof - k + 1))

    def _set_scale(self, log_scale: float) -> None:
        spread = torch.linspace(-1.0, 1.0, self.components) if self.components > 1 else 0.0
        with torch.no_grad():
            self.weight.bias.copy_(log_scale + spread)

    @torch.no_grad()
    def initialize(self, S: Tensor, Y: Tensor | None = None) -> None:
        """Set the common scale from the mean trace of ``S: (N, k, k)`` (``Y``, the spans, is
        not needed; `DistanceGram` uses it). With one component,
        ``E[tr S]`` then matches it exactly on a fresh module (whose per-point weights are all
        equal); with several, the components' scales spread around it on a log scale (their
        geometric mean matches), so the mixture's mean trace is higher (about 1.3x for 4)."""
        trace = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1).mean()
        self._set_scale(math.log(float(trace) / self.k))

    def params(self, Y: Tensor) -> tuple[Tensor, Tensor]:
        """``Sigma(Y): (..., k, k)`` and ``nu(Y): (...)`` of a single Wishart (one component)."""
        if self.components != 1:
            raise ValueError(f"{self.components} components: use mixture_params")
        Sigma, nu, _ = self.mixture_params(Y)
        return Sigma.squeeze(-3), nu.squeeze(-1)

    def mixture_params(self, Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per component: ``Sigma(Y): (..., C, k, k)``, ``nu(Y): (..., C)`` and the log mixture
        weights ``(..., C)``, for ``Y: (..., n - 1, k)``."""
        h = self.graph(Y.new_zeros(()), Y)  # (..., n, hidden)
        Yt = self.graph.points(Y)  # (..., n, k)
        w = torch.exp(self.weight(h)).movedim(-1, -2)  # (..., C, n)
        Sigma = (Yt.mT.unsqueeze(-3) * w.unsqueeze(-2)) @ Yt.unsqueeze(-3)
        pooled = h.mean(-2)
        nu = (self.k - 1) + torch.exp(self.log_dof(pooled))
        log_pi = (torch.zeros_like(nu) if self.logits is None
                  else torch.log_softmax(self.logits(pooled), dim=-1))  # fmt: skip
        return Sigma, nu, log_pi

    def log_prob(self, S: Tensor, Y: Tensor) -> Tensor:
        """``log p(S | Y)``, ``S: (..., k, k)``, ``Y: (..., n - 1, k)`` -> ``(...)``."""
        Sigma, nu, log_pi = self.mixture_params(Y)
        V = Sigma / nu.unsqueeze(-1).unsqueeze(-1)
        return torch.logsumexp(log_pi + wishart_log_prob(S.unsqueeze(-3), nu, V), dim=-1)

    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One ``S ~ p(S | Y)`` per representative, ``(..., k, k)``."""
        Sigma, nu, log_pi = self.mixture_params(Y)
        c = _draw_component(log_pi, generator)
        nu = torch.take_along_dim(nu, c, dim=-1).squeeze(-1)
        Sigma = torch.take_along_dim(Sigma, c[..., None, None], dim=-3).squeeze(-3)
        return wishart_sample(nu, Sigma / nu[..., None, None], generator)


class DistanceGram(nn.Module):
    """``S | Y`` log-normal around a least-squares fit of learned pair distances.

    In Y's frame the points are the rows ``y~_i`` of ``H Y``, and the cloud with Gram matrix S
    has squared pair distances ``d_ij^2(S) = (y~_i - y~_j)^T S (y~_i - y~_j)``, linear in S.
    A `PointGraph` gives invariant per-pair targets ``t_ij > 0``, weights ``w_ij > 0``
    and precisions ``rho_ij >= 0`` (so relabelling permutes them with the points). The centre

        ``S*(Y) = argmin_S sum_{i<j} w_ij (d_ij^2(S) - t_ij)^2``   (`metric_fit`)

    is the metric that best gives the subspace's points the predicted distances. Then
    ``S = L exp(E) L^T`` with ``L L^T = S*`` and E Gaussian with precision (in
    `sym_coords`)

        ``P = sum_{i<j} rho_ij psi_ij psi_ij^T + O(k)-invariant isotropic part``,
        ``psi_ij = sym_coords(u u^T) / |u|^2``, ``u = L^T (y~_i - y~_j)``,

    so ``psi_ij . E`` is, to first order, the relative change of ``d_ij^2`` from ``S*``: each
    pair can pin the metric along its own direction (near-contact pairs of LJ clusters and
    molecules do). The isotropic part has pooled widths ``sigma_0`` (traceless) and
    ``sigma_t`` (trace). ``Y -> Y Q`` sends ``S* -> Q^T S* Q`` and leaves every ``psi . E``
    unchanged, so the density is equivariant and does not depend on the choice of L. With
    ``components > 1`` it is a mixture with invariant weights. ``S*`` is lifted to at least
    ``floor`` times the data's mean eigenvalue where the fit is not positive definite.

    Args:
        n_points: as `WishartGram`.
        k: as `WishartGram`.
        hidden: as `WishartGram`.
        layers: as `WishartGram`.
        labels: as `WishartGram`.
        components: mixture components.
        floor: relative lower bound of the centre's eigenvalues.
    """

    def __init__(
        self,
        n_points: int,
        k: int,
        hidden: int = 32,
        layers: int = 1,
        labels: Tensor | None = None,
        components: int = 1,
        floor: float = 1e-3,
    ):
        super().__init__()
        if not (isinstance(components, int) and components >= 1):
            raise ValueError(f"components must be a positive integer, got {components!r}")
        self.k, self.components, self.floor = k, components, floor
        self.graph = PointGraph(n_points, k, hidden, layers, labels)
        self.pair = nn.Sequential(nn.Linear(2 * hidden + 2, hidden), nn.SiLU(),
                                  nn.Linear(hidden, 3 * components))  # fmt: skip
        self.spread = nn.Linear(hidden, 3 * components)  # log sigma_0, log sigma_t, logits
        for layer in (self.pair[-1], self.spread):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        with torch.no_grad():
            self.spread.bias[: 2 * components] = math.log(0.3)
            self.pair[-1].bias[2::3] = -4.0  # pair precisions start small: nearly isotropic
        i, j = torch.triu_indices(n_points, n_points, 1)
        self.register_buffer("pairs", torch.stack([i, j]), persistent=False)
        self.register_buffer("scale", torch.tensor(1.0, dtype=torch.float64))

    @torch.no_grad()
    def initialize(self, S: Tensor, Y: Tensor) -> None:
        """Targets start at the data's mean squared pair distance (several components: spread
        around it), and ``scale`` (the eigenvalue floor's unit) at the data's mean
        eigenvalue; ``S: (N, k, k)``, ``Y: (N, n - 1, k)``."""
        d = self._pair_vectors(Y)
        sq = torch.einsum("...pa,...ab,...pb->...p", d, S.to(d), d)
        # components spread over a factor e around it (identical ones never separate)
        spread = torch.linspace(-0.5, 0.5, self.components) if self.components > 1 else 0.0
        self.pair[-1].bias[1::3] = torch.log(sq.mean()) + spread
        self.scale.fill_(float(torch.diagonal(S, dim1=-2, dim2=-1).mean()))

    def _pair_vectors(self, Y: Tensor) -> Tensor:
        Yt = self.graph.points(Y)
        return Yt[..., self.pairs[0], :] - Yt[..., self.pairs[1], :]  # (..., P, k)

    def mixture_params(self, Y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Per component: the Cholesky factor L of the centre ``S*(Y): (..., C, k, k)``, the
        precision of E ``(..., C, m, m)`` (``m = k(k+1)/2``) and the log mixture weights
        ``(..., C)``, for ``Y: (..., n - 1, k)``."""
        C, k = self.components, self.k
        h = self.graph(Y.new_zeros(()), Y)  # (..., n, hidden)
        d = self._pair_vectors(Y)
        hi, hj = h[..., self.pairs[0], :], h[..., self.pairs[1], :]
        feats = torch.cat([hi + hj, hi * hj, (d * d).sum(-1, keepdim=True) * k,
                           (hi - hj).pow(2).mean(-1, keepdim=True)], dim=-1)  # fmt: skip
        out = self.pair(feats).unflatten(-1, (C, 3)).movedim(-2, -3).exp()  # (..., C, P, 3)
        d = d.unsqueeze(-3)
        S = metric_fit(d, out[..., 0], out[..., 1])  # (..., C, k, k)
        eye = torch.eye(k, dtype=d.dtype, device=d.device)
        low = torch.linalg.eigvalsh(S)[..., 0]
        S = S + torch.relu(self.floor * self.scale.to(d) - low)[..., None, None] * eye
        L = torch.linalg.cholesky(S)
        u = (d @ L).unsqueeze(-1)  # L^T d, (..., C, P, k, 1)
        psi = sym_coords(u @ u.mT) / (u * u).sum((-2, -1)).unsqueeze(-1)  # (..., C, P, m)
        pooled = self.spread(h.mean(-2))
        s0, st = pooled[..., :C].exp(), pooled[..., C : 2 * C].exp()
        trace = sym_coords(eye) / math.sqrt(k)
        iso = (eye.new_ones(len(trace)).diag() / s0[..., None, None] ** 2
               + (1 / st**2 - 1 / s0**2)[..., None, None] * torch.outer(trace, trace))  # fmt: skip
        precision = iso + (psi.mT * out[..., 2].unsqueeze(-2)) @ psi
        return L, precision, torch.log_softmax(pooled[..., 2 * C :], dim=-1)

    def log_prob(self, S: Tensor, Y: Tensor) -> Tensor:
        """``log p(S | Y)``, ``S: (..., k, k)``, ``Y: (..., n - 1, k)`` -> ``(...)``."""
        L, precision, log_pi = self.mixture_params(Y)
        lp = spd_lognormal_precision_log_prob(S.unsqueeze(-3), L, precision)
        return torch.logsumexp(log_pi + lp, -1)

    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One ``S ~ p(S | Y)`` per representative, ``(..., k, k)``."""
        L, precision, log_pi = self.mixture_params(Y)
        c = _draw_component(log_pi, generator)
        L = torch.take_along_dim(L, c[..., None, None], dim=-3).squeeze(-3)
        precision = torch.take_along_dim(precision, c[..., None, None], dim=-3).squeeze(-3)
        return spd_lognormal_precision_sample(L, precision, generator)
