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
angles to ``[EPS, pi - EPS]`` so that they give a finite, very low density, never NaN;
`check_angles` refuses training data whose Z-matrix angles come near 0 or 180 degrees.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .zmatrix import ZMatrix

__all__ = ["EPS", "InternalCoordinates", "LOG_SO3_VOLUME", "random_rotation"]

EPS = 1e-6
"""Angles are clamped to ``[EPS, pi - EPS]`` (see the module doc)."""
LOG_SO3_VOLUME = math.log(8 * math.pi**2)
"""log of the Haar volume of SO(3) in the metric where a turn by angle a has length a."""


def _unit(v: Tensor) -> Tensor:
    # a zero vector (a straight angle) stays zero: degenerate but finite, never NaN
    return v / v.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def _angle(u: Tensor, w: Tensor) -> Tensor:
    """The angle between vectors ``u, w: (..., 3)``, stable near 0 and pi."""
    return torch.atan2(torch.linalg.cross(u, w).norm(dim=-1), (u * w).sum(-1))


def _dihedral(xi: Tensor, xj: Tensor, xk: Tensor, xl: Tensor) -> Tensor:
    """The torsion ``i-j-k-l`` in ``(-pi, pi]``: the angle about ``j -> k`` from l to i."""
    axis = _unit(xk - xj)
    v = xi - xj
    w = xl - xk
    v = v - (v * axis).sum(-1, keepdim=True) * axis
    w = w - (w * axis).sum(-1, keepdim=True) * axis
    return torch.atan2((torch.linalg.cross(axis, v) * w).sum(-1), (v * w).sum(-1))


def _place(xj: Tensor, xk: Tensor, xl: Tensor, b: Tensor, theta: Tensor, phi: Tensor) -> Tensor:
    """The atom i with bond ``|i - j| = b``, angle ``i-j-k = theta``, torsion ``i-j-k-l = phi``
    (the inverse of `_dihedral` and `_angle`; NeRF)."""
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
        phi = _dihedral(i, j, k, l)
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
        """Raise a ``ValueError`` naming the atoms if some Z-matrix angle of the molecules
        ``x: (N, n, 3)`` comes within ``margin_deg`` of 0 or 180 degrees (a linear group,
        whose torsion is undefined)."""
        theta = torch.rad2deg(self.split(self(x)[1])[1])
        low = margin_deg
        bad = (theta < low) | (theta > 180 - low)
        if bad.any():
            m = int(bad.any(0).nonzero()[0])
            zm = self.zmatrix
            atoms = ((zm.root[2], zm.root_bond, zm.root[1] if zm.root_bond == zm.root[0]
                      else zm.root[0]) if m == 0 else zm.rows[m - 1][:3])  # fmt: skip
            raise ValueError(
                f"the angle {'-'.join(map(str, atoms))} reaches "
                f"{float(theta[:, m].max() if theta[:, m].max() > 90 else theta[:, m].min()):.1f}"
                f" degrees in {int(bad[:, m].sum())} molecules: internal coordinates need "
                f"angles at least {margin_deg:g} degrees from 0 and 180 (a linear group such as "
                "an alkyne or nitrile is not supported; use --geometry cartesian)")
