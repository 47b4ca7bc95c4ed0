r"""Internal coordinates: a bijection between centred molecules and (orientation, q).

For a `ZMatrix` of n atoms, a molecule ``x: (..., n, 3)`` (any translation) maps to its
orientation ``R: (..., 3, 3)`` in SO(3) (the frame of the three root atoms) and
``q: (..., 3n - 6)``, laid out as

``[bonds (r + 2) | angles (r + 1) | torsions (r) | ring block (3c)]``

for ``r`` Z-matrix rows and ``c`` atoms in the Cartesian block: the root's two bond lengths
and its angle, each row's bond length, angle ``(0, pi)`` and torsion ``(-pi, pi]``, and the
block atoms' coordinates in the root frame. `InternalCoordinates.inverse` places the atoms
back (NeRF for the rows) and centres them.

The volume: with ``z`` the (n - 1) 3 centred coordinates (an orthonormal basis of the
centred subspace, as `grassflow.flows.ShapeFlow`'s Helmert coordinates) and the orientation
measured by the Haar measure of SO(3) with total mass ``8 pi^2`` (the metric in which a turn
by angle ``a`` has length ``a``),

``dz = n^{-3/2} prod_bonds b^2 prod_angles sin(theta) dR dq``

(each atom placed in spherical coordinates about its bond partner; block atoms by a
rotation, which keeps volume; ``n^{3/2}`` from the centre of mass). So a density ``p(q)``
with a uniform orientation is the density ``p(q) / (8 pi^2 J(q))`` on z
(`InternalCoordinates.log_volume` is ``log J``).

Near-linear angles: the torsion about a straight angle is undefined and ``sin(theta)`` is 0,
so such configurations have volume (and density) 0. `InternalCoordinates.forward` clamps
angles to ``[EPS, pi - EPS]`` so that they give a finite, very low density, never NaN.
Linear groups (nitriles, alkynes) are straight in every conformer: `straight_angles` finds
them in the training data, and `grassflow.manifolds.zmatrix.build_zmatrix` chooses
references around them. `InternalCoordinates.check_angles` refuses training data in which
a Z-matrix angle ``i-j-k``, or the angle ``j-k-l`` of a torsion's axis and reference (the
torsion is undefined when l lies on the axis), comes near 0 or 180 degrees.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .zmatrix import ZMatrix, graph_distances

__all__ = ["EPS", "InternalCoordinates", "LOG_SO3_VOLUME", "dihedral", "random_rotation",
           "straight_angles"]

EPS = 1e-6
"""Angles are clamped to ``[EPS, pi - EPS]`` (see the module doc)."""
AXIS_FRACTION = 0.01
"""`InternalCoordinates.check_angles` refuses a torsion reference on its axis in more than
this fraction of the molecules (broad random data has a few by chance; a rod, all)."""
STRAIGHT_DEG = 15.0
"""An angle whose median over the data is within this of 180 degrees is straight
(`straight_angles`). Rods are within a few degrees; 15 leaves propyne's terminal H a
reference (a methyl H at 161 degrees seen from the H's carbon: no atom is farther off the
axis) and benzonitrile's meta carbons (161 degrees from the nitrile C)."""
LOG_SO3_VOLUME = math.log(8 * math.pi**2)
"""log of the Haar volume of SO(3) in the metric where a turn by angle a has length a."""


def _unit(v: Tensor) -> Tensor:
    # a zero vector (a straight angle) stays zero: degenerate but finite, never NaN
    return v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def _angle(u: Tensor, w: Tensor) -> Tensor:
    """The angle between vectors ``u, w: (..., 3)``, stable near 0 and pi."""
    return torch.atan2(torch.linalg.cross(u, w).norm(dim=-1), (u * w).sum(-1))


def dihedral(xi: Tensor, xj: Tensor, xk: Tensor, xl: Tensor) -> Tensor:
    """The torsion ``i-j-k-l`` ``(...)`` in ``(-pi, pi]`` of atoms ``x*: (..., 3)``: the angle
    about ``j -> k`` from l to i."""
    axis = _unit(xk - xj)
    v = xi - xj
    w = xl - xk
    v = v - (v * axis).sum(-1, keepdim=True) * axis
    w = w - (w * axis).sum(-1, keepdim=True) * axis
    return torch.atan2((torch.linalg.cross(axis, v) * w).sum(-1), (v * w).sum(-1))


def _place(xj: Tensor, xk: Tensor, xl: Tensor, b: Tensor, theta: Tensor, phi: Tensor) -> Tensor:
    """The atom i with bond ``|i - j| = b``, angle ``i-j-k = theta``, torsion ``i-j-k-l = phi``
    (the inverse of `dihedral` and `_angle`; NeRF)."""
    axis = _unit(xk - xj)
    w = xl - xk
    w = _unit(w - (w * axis).sum(-1, keepdim=True) * axis)
    n = torch.linalg.cross(axis, w)
    s = torch.sin(theta)[..., None]
    d = torch.cos(theta)[..., None] * axis + s * (torch.cos(phi)[..., None] * w
                                                  - torch.sin(phi)[..., None] * n)  # fmt: skip
    return xj + b[..., None] * d


def random_rotation(m: int, dtype: torch.dtype, device: torch.device | None = None,
                    generator: torch.Generator | None = None) -> Tensor:  # fmt: skip
    """``m`` Haar-uniform rotations ``(m, 3, 3)`` (unit quaternions; CPU generator)."""
    q = _unit(torch.randn(m, 4, dtype=dtype, generator=generator)).to(device)
    w, x, y, z = q.unbind(-1)
    R = torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
    ], -1)  # fmt: skip
    return R.reshape(m, 3, 3)


class InternalCoordinates(nn.Module):
    """The bijection ``x <-> (R, q)`` of a `ZMatrix` (see the module doc); an ``nn.Module``
    so that its index buffers follow ``.to(device)``.

    Attributes:
        zmatrix: the `ZMatrix`.
        n_bonds, n_angles, n_torsions, n_block: sizes of q's four parts.
    """

    def __init__(self, zmatrix: ZMatrix):
        super().__init__()
        self.zmatrix = zm = zmatrix
        self.n_atoms = zm.n_atoms
        r, c = len(zm.rows), len(zm.cartesian)
        self.n_bonds, self.n_angles, self.n_torsions, self.n_block = r + 2, r + 1, r, 3 * c
        rows = torch.tensor(zm.rows, dtype=torch.long).reshape(r, 4)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("block", torch.tensor(zm.cartesian, dtype=torch.long),
                             persistent=False)  # fmt: skip

    @property
    def dim(self) -> int:
        """3 n - 6, the size of q."""
        return self.n_bonds + self.n_angles + self.n_torsions + self.n_block

    def split(self, q: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """q's bonds, angles, torsions and block coordinates (views)."""
        return q.split([self.n_bonds, self.n_angles, self.n_torsions, self.n_block], dim=-1)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(R: (..., 3, 3), q: (..., 3n - 6))`` of molecules ``x: (..., n, 3)``."""
        zm = self.zmatrix
        a0, a1, a2 = zm.root
        other = a1 if zm.root_bond == a0 else a0
        e1 = _unit(x[..., a1, :] - x[..., a0, :])
        v = x[..., a2, :] - x[..., a0, :]
        e2 = _unit(v - (v * e1).sum(-1, keepdim=True) * e1)
        R = torch.stack([e1, e2, torch.linalg.cross(e1, e2)], dim=-1)
        bond_root = x[..., zm.root_bond, :]
        b = [(x[..., a1, :] - x[..., a0, :]).norm(dim=-1, keepdim=True),
             (x[..., a2, :] - bond_root).norm(dim=-1, keepdim=True)]  # fmt: skip
        theta = [_angle(x[..., a2, :] - bond_root, x[..., other, :] - bond_root)[..., None]]
        i, j, k, l = (x[..., self.rows[:, m], :] for m in range(4))
        b.append((i - j).norm(dim=-1))
        theta.append(_angle(i - j, k - j))
        phi = dihedral(i, j, k, l)
        block = ((x[..., self.block, :] - x[..., a0, None, :]) @ R).flatten(-2)
        theta = torch.cat(theta, -1).clamp(EPS, math.pi - EPS)
        return R, torch.cat([*b, theta, phi, block], -1)

    def inverse(self, R: Tensor, q: Tensor) -> Tensor:
        """Centred molecules ``x: (..., n, 3)`` of orientations ``R: (..., 3, 3)`` and
        ``q: (..., 3n - 6)``."""
        zm = self.zmatrix
        a0, a1, a2 = zm.root
        bonds, theta, phi, block = self.split(q)
        zero = torch.zeros_like(bonds[..., 0])
        pos: list[Tensor | None] = [None] * self.n_atoms  # in the root frame
        pos[a0] = torch.stack([zero, zero, zero], -1)
        pos[a1] = torch.stack([bonds[..., 0], zero, zero], -1)
        c, s = torch.cos(theta[..., 0]), torch.sin(theta[..., 0])
        if zm.root_bond == a0:  # angle a2-a0-a1
            pos[a2] = torch.stack([bonds[..., 1] * c, bonds[..., 1] * s, zero], -1)
        else:  # angle a2-a1-a0
            pos[a2] = torch.stack([bonds[..., 0] - bonds[..., 1] * c, bonds[..., 1] * s, zero],
                                  -1)  # fmt: skip
        for m, a in enumerate(zm.cartesian):
            pos[a] = block[..., 3 * m: 3 * m + 3]
        for m, (i, j, k, l) in enumerate(zm.rows):
            pos[i] = _place(pos[j], pos[k], pos[l], bonds[..., m + 2], theta[..., m + 1],
                            phi[..., m])  # fmt: skip
        local = torch.stack(pos, dim=-2)
        x = local @ R.mT
        return x - x.mean(dim=-2, keepdim=True)

    def log_volume(self, q: Tensor) -> Tensor:
        """``log J(q): (...)``, with ``dz = J(q) dR dq`` on the centred coordinates z."""
        bonds, theta, _, _ = self.split(q)
        return 2 * bonds.log().sum(-1) + theta.sin().log().sum(-1) - 1.5 * math.log(self.n_atoms)

    def check_angles(self, x: Tensor, margin_deg: float = 5.0) -> None:
        """Raise a ``ValueError`` naming the atoms if, in the molecules ``x: (N, n, 3)``, some
        Z-matrix angle ``i-j-k`` (the root's included) comes within ``margin_deg`` of 0 or
        180 degrees in any molecule (the torsion about a straight angle is undefined and
        ``sin(theta) = 0``), or some row's ``j-k-l`` (its torsion axis j -> k and reference
        l) does in more than `AXIS_FRACTION` of them: a reference on the axis, as a linear
        group's, leaves the torsion undefined (the volume holds, but the torsion jumps)."""
        zm = self.zmatrix
        a0, a1, _ = zm.root
        theta = torch.rad2deg(self.split(self(x)[1])[1])
        j, k, l = (x[..., self.rows[:, m], :] for m in range(1, 4))
        axis = torch.rad2deg(_angle(j - k, l - k)).reshape(len(x), len(zm.rows))
        angles = torch.cat([theta, axis], -1)
        triples = [(zm.root[2], zm.root_bond, a1 if zm.root_bond == a0 else a0),
                   *(r[:3] for r in zm.rows), *(r[1:] for r in zm.rows)]  # fmt: skip
        bad = (angles < margin_deg) | (angles > 180 - margin_deg)
        r = len(zm.rows) + 1  # an axis reference is refused where it is straight in over 1 %
        refused = torch.cat([bad[:, :r].any(0), bad[:, r:].double().mean(0) > AXIS_FRACTION])
        if not refused.any():
            return
        m = int(refused.nonzero()[0])
        a = angles[:, m]
        worst = float(a[torch.minimum(a, 180 - a).argmin()])
        what = f"the angle {'-'.join(map(str, triples[m]))}" if m < r else (
            f"the torsion reference of atom {zm.rows[m - r][0]}: the angle "
            f"{'-'.join(map(str, triples[m]))}")  # fmt: skip
        head = (f"{what} reaches {worst:.1f} degrees in {int(bad[:, m].sum())} molecules: "
                f"internal coordinates need every Z-matrix angle i-j-k, and every torsion's "
                f"j-k-l in {100 * (1 - AXIS_FRACTION):g} % of the molecules, at least "
                f"{margin_deg:g} degrees from 0 and 180")  # fmt: skip
        if _linear(x):
            raise ValueError(f"{head}, and this molecule is linear (all its atoms on one line),"
                             " so it has no frame of internal coordinates; use --geometry "
                             "cartesian")  # fmt: skip
        if not STRAIGHT_DEG < float(a.median()) < 180 - STRAIGHT_DEG:  # a linear group the
            # Z-matrix was not told of (straight in the median, as `straight_angles` finds)
            raise ValueError(f"{head}; these atoms are on a straight line (a linear group "
                             "such as a nitrile or alkyne): build the Z-matrix around the "
                             "data's straight angles, build_zmatrix(..., straight="
                             "straight_angles(P, bonds)), as `grassflow train --data` does")
        raise ValueError(f"{head}; it is straight in only some of them, which the Z-matrix's "
                         "references (chosen from the median angles) cannot avoid; use "
                         "--geometry cartesian")  # fmt: skip


def _linear(x: Tensor, ratio: float = 0.1) -> bool:
    """Whether molecules ``x: (N, n, 3)`` are linear: in the median molecule the spread off
    the principal axis is below ``ratio`` of the spread along it."""
    s = torch.linalg.svdvals(x - x.mean(-2, keepdim=True))
    return bool((s[:, 1] / s[:, 0].clamp_min(torch.finfo(x.dtype).tiny)).median() < ratio)


def straight_angles(P: Tensor, bonds, max_bonds: int = 4, tol_deg: float = STRAIGHT_DEG,
                    max_molecules: int = 500,
                    chunk: int = 4096) -> tuple[tuple[int, int, int], ...]:  # fmt: skip
    """The straight angles of molecules ``P: (N, n, 3)``: every ``(a, b, c)`` (``a < c``, a
    and c within ``max_bonds`` bonds of b in the graph ``bonds: (B, 2)``) whose median angle
    at b over the molecules (at most ``max_molecules`` of them, evenly spaced) is within
    ``tol_deg`` of 180 degrees: three collinear atoms, b in the middle (their angles at a
    and c are then near 0), for `grassflow.manifolds.zmatrix.build_zmatrix`'s ``straight``.
    """
    if not isinstance(P, Tensor) or P.dim() != 3 or P.shape[-1] != 3 or len(P) == 0:
        raise ValueError(f"P must be (N, n, 3) molecules, got "
                         f"{tuple(P.shape) if isinstance(P, Tensor) else type(P).__name__}")
    n = P.shape[1]
    near = [[a for a, d in enumerate(row) if 0 < d <= max_bonds]
            for row in graph_distances(n, bonds)]  # fmt: skip
    triples = [(a, b, c) for b in range(n) for i, a in enumerate(near[b]) for c in near[b][i + 1:]]
    if not triples:
        return ()
    keep = torch.linspace(0, len(P) - 1, min(len(P), max_molecules), dtype=torch.float64)
    P = P[keep.round().long().to(P.device)]
    t = torch.tensor(triples, dtype=torch.long, device=P.device)
    median = torch.cat([torch.rad2deg(_angle(P[:, s[:, 0]] - P[:, s[:, 1]], P[:, s[:, 2]]
                                             - P[:, s[:, 1]])).median(0).values
                        for s in t.split(chunk)])  # fmt: skip
    return tuple(triples[m] for m in (median > 180 - tol_deg).nonzero()[:, 0].tolist())
