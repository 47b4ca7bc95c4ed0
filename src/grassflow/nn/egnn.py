"""An E(n)-equivariant graph network (EGNN) velocity field for point clouds.

The field of the library's shape model, the equivariant flow-matching CNF
(`grassflow.flows.ShapeFlow`): the EGNN of
Satorras et al. (2021) in the "dynamics" form that E-NF and EFM use. Node features start from
the time (and optional per-point labels, e.g. atom types, one-hot); each layer forms messages
from both end points' features, the squared distance and, for a molecule, the pair's place in
its bond graph (`bond_graph_features`), gates them (attention), moves every
point along normalized difference vectors by a bounded (tanh) amount, and updates the
features residually. The velocity is the total displacement, centred. Only differences and
distances enter, so the velocity is equivariant to rotations, reflections, translations and
permutations of the points (with labels: the permutations that keep the labels; with a
bond graph: those that also keep the bonds, i.e. the graph's automorphisms). Labels given per
call (molecules of different compositions) permute with the points.

References:
    Satorras, Hoogeboom, Welling. E(n) Equivariant Graph Neural Networks. ICML 2021.
    Klein, Krämer, Noé. Equivariant Flow Matching. NeurIPS 2023.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from ..data.cloud_chemistry import BOND_ORDERS, bond_table

__all__ = ["EGNNField", "bond_graph_features", "graph_distances"]

#: graph distances with their own edge feature: 1 (bonded), 2 (angle), 3 (torsion), >= 4
_MAX_HOPS = 4


@functools.lru_cache(maxsize=16)
def _ordered_pairs(n: int) -> tuple[Tensor, Tensor]:
    """``(i, j)`` of the n (n - 1) ordered pairs i != j, grouped by i (n - 1 per point)."""
    i = torch.arange(n).repeat_interleave(n - 1)
    j = torch.tensor([b for a in range(n) for b in range(n) if b != a])
    return i, j


def graph_distances(bonds: Tensor, n: int) -> Tensor:
    """Shortest-path lengths ``(n, n)`` (int64; n for disconnected pairs) of the graph on n
    points with edges ``bonds: (B, 2)`` (Floyd-Warshall; molecules are small)."""
    D = torch.full((n, n), n, dtype=torch.int64)
    D.fill_diagonal_(0)
    D[bonds[:, 0], bonds[:, 1]] = D[bonds[:, 1], bonds[:, 0]] = 1
    for k in range(n):
        D = torch.minimum(D, D[:, k : k + 1] + D[k : k + 1, :])
    return D


def bond_graph_features(bonds: Tensor, n: int, orders: Tensor | None = None) -> Tensor:
    """Edge features ``(n (n - 1), 8)`` of the ordered pairs (`_ordered_pairs` order): the
    one-hot graph distance (1, 2, 3, >= 4 or disconnected) and, for bonded pairs, the one-hot
    bond order (`BOND_ORDERS`; all zero when ``orders`` is None). Distances 2 and 3 let the
    field tell angle and torsion partners from the rest of the molecule."""
    i, j = _ordered_pairs(n)
    hops = graph_distances(bonds, n)[i, j].clamp_max(_MAX_HOPS) - 1
    out = torch.zeros(len(i), _MAX_HOPS + len(BOND_ORDERS), dtype=torch.float64)
    out[torch.arange(len(i)), hops] = 1.0
    if orders is not None:
        index = torch.full((n, n), -1, dtype=torch.int64)
        kind = torch.tensor([BOND_ORDERS.index(float(o)) for o in orders], dtype=torch.int64)
        index[bonds[:, 0], bonds[:, 1]] = index[bonds[:, 1], bonds[:, 0]] = kind
        k = index[i, j]
        out[(k >= 0).nonzero().flatten(), _MAX_HOPS + k[k >= 0]] = 1.0
    return out


def _mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.SiLU(), nn.Linear(hidden, d_out))


class EGNNField(nn.Module):
    """Velocity ``v(t, x)`` of clouds ``x: (..., n, d)``, equivariant under E(d) x S_n.

    Pairs are formed without the diagonal, so forward-mode derivatives (the exact divergence)
    never meet ``sqrt(0)``.

    Args:
        n_points: n, points per cloud.
        dim: d, their dimension.
        hidden: width of node and message features (EFM: 32 on DW4 and LJ13).
        layers: message-passing layers (EFM: 3).
        attention: gate each message by ``sigmoid(Linear(m_ij))``.
        coord_range: bound of each pair's displacement per layer (``coord_range tanh(.)``).
        labels: optional ``(n,)`` non-negative integer labels of the points (e.g. atomic
            numbers), the same for every cloud, one-hot in the initial node features as in
            `PointGraph`. None (default) builds the unlabelled
            field exactly as before labels existed (same parameters, state dict, numbers).
        n_labels: number of label values (default ``labels.max() + 1``). Given without
            ``labels``, the labels are an input of every call instead (clouds of different
            compositions, e.g. QM9's molecules): ``forward(t, x, labels)``.
        bonds: optional ``(B, 2)`` bonded point pairs (a molecule's bond graph), the same
            for every cloud; each message then also sees `bond_graph_features`. None (default)
            keeps the field without them (same parameters, state dict, numbers).
        bond_orders: optional ``(B,)`` orders of those bonds (`BOND_ORDERS`).
    """

    def __init__(
        self,
        n_points: int,
        dim: int,
        hidden: int = 32,
        layers: int = 3,
        attention: bool = True,
        coord_range: float = 10.0,
        labels: Tensor | None = None,
        n_labels: int | None = None,
        bonds: Tensor | None = None,
        bond_orders: Tensor | None = None,
    ):
        super().__init__()
        if not (isinstance(n_points, int) and isinstance(dim, int) and n_points >= 2 and dim >= 1):
            raise ValueError(f"need integers n_points >= 2 and dim >= 1, got {n_points}, {dim}")
        if not (isinstance(hidden, int) and isinstance(layers, int) and min(hidden, layers) >= 1):
            raise ValueError(f"hidden and layers must be positive integers, got {hidden}, {layers}")
        if not coord_range > 0:
            raise ValueError(f"coord_range must be > 0, got {coord_range!r}")
        self.n_points, self.dim, self.hidden, self.coord_range = n_points, dim, hidden, coord_range
        self.n_labels = 0
        if labels is None and n_labels is not None:
            if not (isinstance(n_labels, int) and n_labels >= 1):
                raise ValueError(f"n_labels must be a positive integer, got {n_labels!r}")
            self.n_labels = n_labels
        if labels is not None:
            labels = torch.as_tensor(labels)
            if labels.shape != (n_points,) or labels.is_floating_point() or (labels < 0).any():
                raise ValueError(f"labels must be {n_points} non-negative integers, got {labels}")
            self.n_labels = int(labels.max()) + 1 if n_labels is None else n_labels
            if self.n_labels <= labels.max():
                raise ValueError(f"n_labels = {n_labels} <= the largest label {labels.max()}")
            # only when labelled: an unlabelled field keeps its old state dict
            self.register_buffer("labels", labels.long())
        else:
            self.labels = None
        if bonds is not None:
            numpy = lambda a: None if a is None else torch.as_tensor(a).cpu().numpy()
            bonds, bond_orders = bond_table(numpy(bonds), n_points, "bonds", numpy(bond_orders))
            if not len(bonds):
                raise ValueError("bonds is empty; pass bonds=None for a field without a graph")
            bonds = torch.from_numpy(bonds)
            bond_orders = None if bond_orders is None else torch.from_numpy(bond_orders)
            self.register_buffer("bonds", bonds)
            self.register_buffer("edges", bond_graph_features(bonds, n_points, bond_orders))
        elif bond_orders is not None:
            raise ValueError("bond_orders without bonds")
        else:
            self.bonds = self.edges = None
        self.embed = nn.Linear(1 + self.n_labels, hidden)
        # the first message layer, Linear(h_i, h_j, r2), as per-point products gathered onto
        # the pairs: n instead of n (n - 1) products of width hidden, the costliest step
        self.source = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.target = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.distance = nn.ModuleList(nn.Linear(1, hidden, bias=False) for _ in range(layers))
        if self.edges is not None:
            self.edge = nn.ModuleList(nn.Linear(self.edges.shape[1], hidden, bias=False)
                                      for _ in range(layers))  # fmt: skip
        self.message = nn.ModuleList(
            nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU()) for _ in range(layers)
        )
        gates = nn.ModuleList(nn.Linear(hidden, 1) for _ in range(layers))
        self.gate = gates if attention else None
        self.coord = nn.ModuleList(_mlp(hidden, hidden, 1) for _ in range(layers))
        self.update = nn.ModuleList(_mlp(2 * hidden, hidden, hidden) for _ in range(layers))
        for mlp in self.coord:  # small first displacements: the field starts near zero
            nn.init.xavier_uniform_(mlp[-1].weight, gain=1e-3)
            nn.init.zeros_(mlp[-1].bias)

    def extra_repr(self) -> str:
        labels = f", labels={self.n_labels}" if self.n_labels else ""
        bonds = "" if self.edges is None else f", bonds={len(self.bonds)}"
        return (f"n_points={self.n_points}, dim={self.dim}, coord_range={self.coord_range:g}"
                f"{labels}{bonds}")  # fmt: skip

    @property
    def labels_per_cloud(self) -> bool:
        """Whether every call takes the clouds' labels (``n_labels`` without ``labels``)."""
        return self.n_labels > 0 and self.labels is None

    def forward(self, t: Tensor, x: Tensor, labels: Tensor | None = None) -> Tensor:
        """``t``: scalar or ``(...)`` times; ``x: (..., n, d)`` -> ``v: (..., n, d)``, centred.
        ``labels: (..., n)`` integers in ``0..n_labels - 1``: those of each cloud, for a field
        built with ``n_labels`` only (and only then)."""
        n = self.n_points
        i, j = (idx.to(x.device) for idx in _ordered_pairs(n))
        t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        t = t.reshape(*t.shape, 1, 1).expand(*x.shape[:-2], n, 1)
        if (labels is None) == self.labels_per_cloud:
            raise ValueError("this field takes the clouds' labels in every call"
                             if labels is None  # fmt: skip
                             else "this field has no per-cloud labels: pass labels=None")
        labels = self.labels if labels is None else labels
        if labels is not None:
            onehot = nn.functional.one_hot(labels, self.n_labels).to(x.dtype)
            t = torch.cat([t, onehot.expand(*x.shape[:-2], n, self.n_labels)], dim=-1)
        h = self.embed(t)
        x0, batch = x, x.shape[:-2]
        for k, (message, coord, update) in enumerate(zip(self.message, self.coord, self.update)):
            diff = x[..., i, :] - x[..., j, :]  # (..., n (n - 1), d)
            r2 = diff.square().sum(-1, keepdim=True)
            pre = self.source[k](h)[..., i, :] + self.target[k](h)[..., j, :]
            if self.edges is not None:
                pre = pre + self.edge[k](self.edges.to(x.dtype))
            m = message(pre + self.distance[k](r2))
            if self.gate is not None:
                m = m * torch.sigmoid(self.gate[k](m))
            step = diff / (r2.sqrt() + 1.0) * (self.coord_range * torch.tanh(coord(m)))
            x = x + step.reshape(*batch, n, n - 1, self.dim).sum(-2)
            agg = m.reshape(*batch, n, n - 1, self.hidden).sum(-2)
            h = h + update(torch.cat([h, agg], dim=-1))
        v = x - x0
        return v - v.mean(dim=-2, keepdim=True)
