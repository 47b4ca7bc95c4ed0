"""A permutation- and O(k)-invariant potential for point clouds on Gr(k, n - 1).

A centred cloud of n points in R^k, written in the Helmert basis H (n x (n-1)) of 1-perp, is
``P' = Y B`` with [Y] in Gr(k, n - 1) (the com-free protocol). The rows of ``Y~ = H Y``
(n x k) are the n points in the subspace's own frame: ``Y -> Y Q`` rotates every row by Q, and
relabelling the points permutes the rows. The potential reads the points only through their
Gram matrix ``G = Y~ Y~^T`` (inner products and squared distances, invariant under O(k)) and
aggregates over points by sums, so it is invariant under both groups. Its Riemannian gradient
(`GrassmannField`) is then horizontal and equivariant under O(k)
and under permutations, and a GrCNF with it has a density invariant to rotations and
reflections of the basis and to relabelling of the points.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..manifolds.shape_space import helmert_basis
from . import jet
from .layers import ConcatSquash

__all__ = ["GraphPotential", "PointGraph"]


class PointGraph(nn.Module):
    """Invariant per-point features of a cloud: message passing on the complete graph.

    Node features start from ``n |y~_i|^2`` (and optional fixed per-point labels); each layer
    sends messages ``m_ij = MLP(h_i, h_j, n y~_i.y~_j, n |y~_i - y~_j|^2, t)``, averages them
    over j and updates ``h_i`` residually. The factor n makes the features O(1): the rows of
    an orthonormal Y~ have ``sum_i |y~_i|^2 = k``. Every nonlinearity is smooth (SiLU), as the
    Laplace-Beltrami divergence needs second derivatives. All layers take the time, so ``t``
    may be a scalar or one time per cloud, ``(...)``.

    Args:
        n_points: n, the number of points; representatives are ``(..., n - 1, k)``.
        k: the points' dimension.
        hidden: width of node and edge features.
        layers: message-passing layers.
        labels: optional ``(n,)`` integer labels of the points (e.g. atom types), the same for
            every cloud; the features are then invariant only to relabellings that keep them.
        n_labels: number of label values (default ``labels.max() + 1``).
    """

    def __init__(
        self,
        n_points: int,
        k: int,
        hidden: int = 32,
        layers: int = 2,
        labels: Tensor | None = None,
        n_labels: int | None = None,
    ):
        super().__init__()
        if not (isinstance(n_points, int) and isinstance(k, int) and 1 <= k < n_points - 1):
            raise ValueError(
                f"need integers 1 <= k < n_points - 1, got n_points={n_points}, k={k}"
            )
        if not (isinstance(hidden, int) and isinstance(layers, int) and min(hidden, layers) >= 1):
            raise ValueError(f"hidden and layers must be positive integers, got {hidden}, {layers}")
        self.n_points, self.k, self.hidden = n_points, k, hidden
        self.register_buffer("H", helmert_basis(n_points))  # float64; used in Y's dtype
        onehot = torch.zeros(n_points, 0)
        if labels is not None:
            labels = torch.as_tensor(labels)
            if labels.shape != (n_points,) or labels.is_floating_point() or (labels < 0).any():
                raise ValueError(f"labels must be {n_points} non-negative integers, got {labels}")
            n_labels = int(labels.max()) + 1 if n_labels is None else n_labels
            onehot = nn.functional.one_hot(labels.long(), n_labels).to(torch.get_default_dtype())
        self.register_buffer("onehot", onehot)
        self.embed = ConcatSquash(1 + onehot.shape[1], hidden)
        self.message = nn.ModuleList(ConcatSquash(2 * hidden + 2, hidden) for _ in range(layers))
        self.message_out = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.update = nn.ModuleList(ConcatSquash(2 * hidden, hidden) for _ in range(layers))

    def extra_repr(self) -> str:
        return f"n_points={self.n_points}, k={self.k}, labels={self.onehot.shape[1]}"

    def points(self, Y: Tensor) -> Tensor:
        """``Y~ = H Y: (..., n, k)``, the points in the frame of the representative Y."""
        return self.H.to(dtype=Y.dtype, device=Y.device) @ Y

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``t``: scalar or ``(...)``; ``Y: (..., n - 1, k)`` -> ``h: (..., n, hidden)``."""
        act = jet.silu
        n = self.n_points
        Yt = self.points(Y)
        G = n * (Yt @ Yt.mT)  # (..., n, n)
        sq = G.diagonal(dim1=-2, dim2=-1)  # (..., n)
        edges = jet.stack([G, sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2 * G], dim=-1)
        t = torch.as_tensor(t).to(dtype=Y.dtype, device=Y.device)
        t_node = t if t.dim() == 0 else t[..., None]  # broadcasts over the points (and pairs)
        t_edge = t if t.dim() == 0 else t[..., None, None]
        labels = self.onehot.to(dtype=Y.dtype, device=Y.device).expand(*sq.shape, -1)
        h = act(self.embed(t_node, jet.cat([sq.unsqueeze(-1), labels], dim=-1)))
        for message, message_out, update in zip(self.message, self.message_out, self.update):
            pairs = _pair_mean(message, t_edge, h, edges)
            m = jet.linear(pairs, message_out.weight, message_out.bias)
            h = h + act(update(t_node, jet.cat([h, m], dim=-1)))
        return h


def _pair_layer(layer: ConcatSquash, t: Tensor, h: Tensor, edges: Tensor) -> Tensor:
    """``layer(t, [h_i, h_j, e_ij])`` for all pairs, ``(..., n, n, out)``, without forming the
    concatenation: the linear part splits into ``A h_i + B h_j + C e_ij``, so the pair cost is
    O(n^2 out) instead of O(n^2 out (2h + e)). The mean over j and the following linear layer
    commute too, which the caller uses."""
    hid = h.shape[-1]
    W, b = layer.linear.weight, layer.linear.bias
    pre = ((h @ W[:, :hid].mT).unsqueeze(-2) + (h @ W[:, hid : 2 * hid].mT).unsqueeze(-3)
           + edges @ W[:, 2 * hid :].mT + b)  # fmt: skip
    tt = t.to(dtype=h.dtype, device=h.device).unsqueeze(-1)
    return pre * torch.sigmoid(layer.gate(tt)) + layer.bias(tt)


def _pair_mean(layer: ConcatSquash, t: Tensor, h: Tensor, edges: Tensor) -> Tensor:
    """``mean_j silu(layer(t, [h_i, h_j, e_ij]))``, ``(..., n, out)``, for tensors or jets."""
    if isinstance(h, jet.Jet) and t.dim() == 0 and h.J is not None and edges.J is not None:
        return _pair_mean_jet(layer, t, h, edges)
    return jet.silu(_pair_layer(layer, t, h, edges)).mean(dim=-2)


def _pair_mean_jet(layer: ConcatSquash, t: Tensor, h: jet.Jet, e: jet.Jet) -> jet.Jet:
    """The jet of `_pair_mean` without the ``(m, ..., n, n, out)`` pair derivatives.

    With ``z_ij = P_i + Q_j + R_ij`` (node, node and edge parts, gate folded in), the mean over
    j of ``f'(z_ij) dz_ij`` and of ``f''(z_ij) sum_a (dz_ij)^2`` expand into contractions over
    j or over the directions a (matrix products), so only O(m n out + n^2 out) is stored.
    """
    hid, n, m = h.v.shape[-1], h.v.shape[-2], h.n_lap
    tt = t.to(dtype=h.dtype, device=h.device).reshape(1)
    g = torch.sigmoid(layer.gate(tt))  # (out,)
    W = layer.linear.weight * g[:, None]
    A, B, C = W[:, :hid], W[:, hid : 2 * hid], W[:, 2 * hid :]
    z = ((h.v @ A.mT).unsqueeze(-2) + (h.v @ B.mT).unsqueeze(-3) + e.v @ C.mT
         + layer.linear.bias * g + layer.bias(tt))  # fmt: skip
    f, d1, d2 = jet.silu_derivatives(z)
    P, Q = h.J @ A.mT, h.J @ B.mT  # (M, ..., n, out)
    eJ = e.J  # (M, ..., n, n, c)
    ein = torch.einsum
    J = (P * d1.mean(-2) + ein("...ijh,a...jh->a...ih", d1, Q) / n
         + (ein("...ijh,a...ijc->a...ihc", d1, eJ) * C).sum(-1) / n)  # fmt: skip
    Pm, Qm, eJm = P[:m], Q[:m], eJ[:m]
    sq = (Pm.square().sum(0).unsqueeze(-2) + Qm.square().sum(0).unsqueeze(-3)
          + ein("...cd,hc,hd->...h", ein("a...c,a...d->...cd", eJm, eJm), C, C)
          + 2 * ein("a...ih,a...jh->...ijh", Pm, Qm)
          + 2 * (ein("a...ih,a...ijc->...ijhc", Pm, eJm) * C).sum(-1)
          + 2 * (ein("a...jh,a...ijc->...ijhc", Qm, eJm) * C).sum(-1))  # fmt: skip
    L = d2 * sq
    if h.L is not None:
        L = L + d1 * ((h.L @ A.mT).unsqueeze(-2) + (h.L @ B.mT).unsqueeze(-3))
    if e.L is not None:
        L = L + d1 * (e.L @ C.mT)
    return jet.Jet(f.mean(-2), J, L.mean(-2), h.n_lap)


class GraphPotential(nn.Module):
    """The potential ``v(t, Y)``: `PointGraph` features, mean over the points, and a
    time-conditioned readout. Arguments as `PointGraph`."""

    supports_jet = True  # forward() is written with jet-aware ops

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.graph = PointGraph(*args, **kwargs)
        self.readout = ConcatSquash(self.graph.hidden, self.graph.hidden)
        self.out = nn.Linear(self.graph.hidden, 1)

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``t``: scalar or ``(...)``; ``Y: (..., n - 1, k)`` -> ``(...)``."""
        pooled = self.graph(t, Y).mean(dim=-2)
        t = torch.as_tensor(t).to(dtype=Y.dtype, device=Y.device)
        out = jet.linear(jet.silu(self.readout(t, pooled)), self.out.weight, self.out.bias)
        return out.squeeze(-1)
