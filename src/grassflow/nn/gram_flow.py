"""A conditional CNF on log S that sharpens a Gram density (S given the span).

:class:`GramFlow` pushes a base density of S given Y (a :class:`~grassflow.nn.gram.WishartGram`
or :class:`~grassflow.nn.gram.DistanceGram`) through a continuous flow on ``E = log S`` in
Sym(k) (k(k+1)/2 dimensions, :func:`~grassflow.distributions.spd.sym_coords`). The field is

    ``v(t, E) = sum_{i<j} w_ij Pi_ij + w_0 I / sqrt(k)``,  ``Pi_ij = u u^T / |u|^2``,
    ``u = y~_i - y~_j``,  ``w_ij = MLP(t, log d_ij^2(exp E), h_i + h_j, h_i * h_j)``,

with ``d_ij^2(S) = u^T S u`` the cloud's squared pair distances under the current S and ``h``
the :class:`~grassflow.nn.graph.PointGraph` features of the span. ``Y -> Y Q`` sends ``u -> Q^T
u`` and ``E -> Q^T E Q``, leaving every ``d_ij`` unchanged, so ``v`` is equivariant and the
density stays equivariant; sums over pairs keep it invariant to relabelling. The last layer
starts at zero, so a fresh GramFlow is its base. It is trained by flow matching on straight
paths from base samples to the data in E (:meth:`GramFlow.fm_loss`), and its exact density
integrates the divergence (m reverse-mode products, m <= 6) with dopri5.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torchdiffeq import odeint

from ..distributions.spd import log_det_dexp, spd_log, sym_coords, sym_from_coords
from .graph import PointGraph

__all__ = ["GramFlow"]


class GramFlow(nn.Module):
    """``log p(S | Y)`` of ``S = exp(phi_1(log S_0))``, ``S_0 ~ base(. | Y)`` (module docs).

    Args:
        base: a Gram density with ``log_prob(S, Y)``, ``sample(Y, generator)`` and ``graph``
            (a :class:`PointGraph`, for n and k).
        hidden, layers, labels: of the field's own :class:`PointGraph` and pair MLP.
        atol, rtol: dopri5 tolerances of :meth:`log_prob` and :meth:`sample`.
    """

    def __init__(
        self,
        base: nn.Module,
        hidden: int = 32,
        layers: int = 1,
        labels: Tensor | None = None,
        atol: float = 1e-6,
        rtol: float = 1e-6,
    ):
        super().__init__()
        n, k = base.graph.n_points, base.graph.k
        self.base, self.k, self.atol, self.rtol = base, k, atol, rtol
        self.graph = PointGraph(n, k, hidden, layers, labels)
        self.pair = nn.Sequential(nn.Linear(2 * hidden + 2, hidden), nn.SiLU(),
                                  nn.Linear(hidden, hidden), nn.SiLU(),
                                  nn.Linear(hidden, 1))  # fmt: skip
        self.trace = nn.Sequential(nn.Linear(hidden + 1, hidden), nn.SiLU(), nn.Linear(hidden, 1))
        for layer in (self.pair[-1], self.trace[-1]):  # v = 0: a fresh GramFlow is its base
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        i, j = torch.triu_indices(n, n, 1)
        self.register_buffer("pairs", torch.stack([i, j]), persistent=False)

    def initialize(self, S: Tensor, Y: Tensor) -> None:
        """The base's :meth:`initialize` (the flow starts as the identity)."""
        self.base.initialize(S, Y)

    # ---------------------------------------------------------------- the field
    def context(self, Y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What the field needs of ``Y: (..., n - 1, k)``: pair vectors ``u: (..., P, k)``,
        directions ``sym_coords(Pi): (..., P, m)``, pair features ``(..., P, 2 hidden)`` and
        pooled features ``(..., hidden)``."""
        h = self.graph(Y.new_zeros(()), Y)
        Yt = self.graph.points(Y)
        u = Yt[..., self.pairs[0], :] - Yt[..., self.pairs[1], :]
        Pi = sym_coords(u.unsqueeze(-1) @ u.unsqueeze(-2)) / (u * u).sum(-1, keepdim=True)
        hi, hj = h[..., self.pairs[0], :], h[..., self.pairs[1], :]
        return u, Pi, torch.cat([hi + hj, hi * hj], -1), h.mean(-2)

    def field(self, t: Tensor, e: Tensor, ctx) -> Tensor:
        """``v(t, e): (..., m)`` at ``e = sym_coords(E): (..., m)``; ``t`` scalar or ``(...)``."""
        u, Pi, pair, pooled = ctx
        S = torch.linalg.matrix_exp(sym_from_coords(e, self.k))
        d2 = torch.einsum("...pa,...ab,...pb->...p", u, S, u)
        t = torch.as_tensor(t, dtype=e.dtype, device=e.device).expand(e.shape[:-1])
        tp = t[..., None, None].expand(*d2.shape, 1)
        w = self.pair(torch.cat([pair, torch.log(d2).unsqueeze(-1), tp], -1))  # (..., P, 1)
        w0 = self.trace(torch.cat([pooled, t[..., None]], -1))  # (..., 1)
        trace = sym_coords(torch.eye(self.k, dtype=e.dtype, device=e.device)) / math.sqrt(self.k)
        return (w * Pi).sum(-2) + w0 * trace

    def _divergence(self, t, e, ctx, create_graph: bool) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            e = e if e.requires_grad else e.detach().requires_grad_(True)
            v = self.field(t, e, ctx)
            div = sum(torch.autograd.grad(v[..., a].sum(), e, create_graph=create_graph,
                                          retain_graph=True)[0][..., a]
                      for a in range(v.shape[-1]))  # fmt: skip
        return v, div

    # ---------------------------------------------------------------- densities
    def log_prob(self, S: Tensor, Y: Tensor) -> Tensor:
        """``log p(S | Y)``, ``S: (..., k, k)`` SPD, ``Y: (..., n - 1, k)`` -> ``(...)``."""
        ctx = self.context(Y)
        create = torch.is_grad_enabled()
        E1 = spd_log(S)

        def rhs(t, state):
            v, div = self._divergence(t, state[0], ctx, create)
            return v, div

        e1 = sym_coords(E1)
        ts = torch.tensor([1.0, 0.0], dtype=S.dtype, device=S.device)
        es, delta = odeint(rhs, (e1, torch.zeros_like(e1[..., 0])), ts, method="dopri5",
                           atol=self.atol, rtol=self.rtol)  # fmt: skip
        E0 = sym_from_coords(es[-1], self.k)
        S0 = torch.linalg.matrix_exp(E0)
        # log p_E(E_0) = log p_S(S_0) + log|dexp(E_0)|; log p_E(E_1) = that - int_0^1 div dt
        # (= + delta(0), integrating 1 -> 0); log p_S(S) = log p_E(E_1) - log|dexp(E_1)|
        lp0 = self.base.log_prob(S0, Y) + log_det_dexp(torch.linalg.eigvalsh(E0))
        return lp0 + delta[-1] - log_det_dexp(torch.linalg.eigvalsh(E1))

    @torch.no_grad()
    def sample(self, Y: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One ``S ~ p(S | Y)`` per representative, ``(..., k, k)``."""
        ctx = self.context(Y)
        e0 = sym_coords(spd_log(self.base.sample(Y, generator)))
        ts = torch.tensor([0.0, 1.0], dtype=e0.dtype, device=e0.device)
        e1 = odeint(lambda t, e: self.field(t, e, ctx), e0, ts, method="dopri5",
                    atol=self.atol, rtol=self.rtol)[-1]  # fmt: skip
        return torch.linalg.matrix_exp(sym_from_coords(e1, self.k))

    def fm_loss(self, S: Tensor, Y: Tensor) -> Tensor:
        """Flow-matching loss ``|v(t, e_t) - (e_1 - e_0)|^2``, ``e_t = (1 - t) e_0 + t e_1``,
        per cloud ``(...)``: ``e_1 = log S`` (data), ``e_0`` of a base sample given the same
        Y, ``t ~ U(0, 1)`` (the global RNG, as the training loop seeds it)."""
        with torch.no_grad():
            e0 = sym_coords(spd_log(self.base.sample(Y)))
            e1 = sym_coords(spd_log(S))
        t = torch.rand(e0.shape[:-1], dtype=e0.dtype, device=e0.device)
        et = e0 + t[..., None] * (e1 - e0)
        v = self.field(t, et, self.context(Y))
        return (v - (e1 - e0)).square().sum(-1)
