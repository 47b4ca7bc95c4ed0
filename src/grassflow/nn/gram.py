"""The conditional density of a cloud's in-span Gram matrix given its subspace.

A centred cloud in Helmert coordinates is ``P' = Y B`` with ``[Y]`` in Gr(k, n - 1); what the
subspace does not say is the Gram matrix ``S = B B^T = Y^T P' P'^T Y`` (the cloud's extent and
the orientation of its principal axes inside [Y]). :class:`WishartGram` models ``S`` given Y
exactly and equivariantly, so that with a Grassmann density it gives an exact density on the
centred coordinates (:func:`~grassflow.distributions.cartesian.cartesian_log_prob_gram`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..distributions.cartesian import wishart_log_prob, wishart_sample
from .graph import PointGraph

__all__ = ["WishartGram"]


class WishartGram(nn.Module):
    """``S | Y ~ Wishart_k(nu(Y), Sigma(Y) / nu(Y))``, so ``E[S | Y] = Sigma(Y)``, with

        ``Sigma(Y) = sum_i w_i(Y) y~_i y~_i^T``,  ``nu(Y) = k - 1 + exp(a(Y))``,

    or a mixture of ``components`` such Wisharts with invariant weights ``pi_c(Y)`` (a cloud's
    extent can be multimodal, e.g. DW4's double-well pair distances),

    where ``y~_i`` are the rows of ``Y~ = H Y`` (the points in Y's frame) and the weights
    ``w_i > 0`` and the pooled ``a`` are invariant functions of the cloud's Gram matrix
    (a :class:`PointGraph`). Since ``Y -> Y Q`` sends ``y~_i -> Q^T y~_i``,
    ``Sigma(Y Q) = Q^T Sigma(Y) Q`` and the density is equivariant, as the Gram form of the
    Cartesian density requires; relabelling the points permutes the ``w_i`` with them, so it
    is also permutation invariant. ``Sigma >= min_i w_i * I`` because ``sum_i y~_i y~_i^T =
    Y^T Y = I``.

    Args:
        n_points, k: clouds of n points in R^k (Gr(k, n - 1)).
        hidden, layers, labels: of the :class:`PointGraph`.
        log_scale: initial ``log w_i`` (all equal at initialization, so ``Sigma = e^log_scale
            I``); set it from the data with :meth:`initialize`.
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
    def initialize(self, S: Tensor) -> None:
        """Set the common scale from the mean trace of ``S: (N, k, k)``. With one component,
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
        if self.components == 1:  # no draw, so one component keeps the generator's stream
            c = torch.zeros_like(log_pi, dtype=torch.long)
        else:
            c = torch.multinomial(log_pi.exp().reshape(-1, self.components), 1,
                                  generator=generator).reshape(*log_pi.shape[:-1], 1)  # fmt: skip
        nu = torch.take_along_dim(nu, c, dim=-1).squeeze(-1)
        Sigma = torch.take_along_dim(Sigma, c[..., None, None], dim=-3).squeeze(-3)
        return wishart_sample(nu, Sigma / nu[..., None, None], generator)
