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
    ):
        super().__init__()
        if not dof > k - 1:
            raise ValueError(f"dof must be > k - 1 = {k - 1}, got {dof}")
        self.k = k
        self.graph = PointGraph(n_points, k, hidden, layers, labels)
        self.weight = nn.Linear(hidden, 1)
        self.log_dof = nn.Linear(hidden, 1)
        for layer in (self.weight, self.log_dof):
            nn.init.zeros_(layer.weight)
        nn.init.constant_(self.weight.bias, log_scale)
        nn.init.constant_(self.log_dof.bias, math.log(dof - k + 1))

    @torch.no_grad()
    def initialize(self, S: Tensor) -> None:
        """Set the common scale so that ``E[tr S]`` matches the mean trace of ``S: (N, k, k)``
        (exactly so on a fresh module, whose per-point weights are all equal)."""
        trace = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1).mean()
        self.weight.bias.fill_(math.log(float(trace) / self.k))

    def params(self, Y: Tensor) -> tuple[Tensor, Tensor]:
        """``Sigma(Y): (..., k, k)`` and ``nu(Y): (...)`` for ``Y: (..., n - 1, k)``."""
        h = self.graph(Y.new_zeros(()), Y)
        Yt = self.graph.points(Y)
        w = torch.exp(self.weight(h).squeeze(-1))  # (..., n)
        Sigma = (Yt.mT * w.unsqueeze(-2)) @ Yt
        nu = (self.k - 1) + torch.exp(self.log_dof(h.mean(-2)).squeeze(-1))
        return Sigma, nu

    def log_prob(self, S: Tensor, Y: Tensor) -> Tensor:
        """``log p(S | Y)``, ``S: (..., k, k)``, ``Y: (..., n - 1, k)`` -> ``(...)``."""
        Sigma, nu = self.params(Y)
        return wishart_log_prob(S, nu, Sigma / nu.unsqueeze(-1).unsqueeze(-1))

    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One ``S ~ p(S | Y)`` per representative, ``(..., k, k)``."""
        Sigma, nu = self.params(Y)
        return wishart_sample(nu, Sigma / nu.unsqueeze(-1).unsqueeze(-1), generator)
