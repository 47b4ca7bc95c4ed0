"""`grassflow.manifolds.internal`: the bijection x <-> (R, q) of a Z-matrix and its volume.

Independent computations: RDKit's bond lengths, angles and dihedrals; the Jacobian of the
inverse map by autograd (``torch.autograd.functional.jacobian``) in exponential coordinates
of SO(3) at a point; the Haar volume of SO(3) from the differential of ``matrix_exp``,
integrated by Gauss-Legendre quadrature; Haar moments (character orthogonality) for
`random_rotation`. All in float64 on embedded conformers of the four molecules of
tests/test_zmatrix.py, and on minimized conformers of its linear groups (benzonitrile,
but-2-yn-1-ol) with the Z-matrix built around their straight angles.
"""

import math

import numpy as np
import pytest
import torch

from conftest import mc_tolerance
from grassflow.manifolds.internal import (
    EPS,
    LOG_SO3_VOLUME,
    InternalCoordinates,
    random_rotation,
    straight_angles,
)
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.manifolds.zmatrix import ZMatrix, build_zmatrix

pytest.importorskip("rdkit")
from rdkit.Chem import rdMolTransforms  # noqa: E402

from test_zmatrix import LINEAR, MOLECULES, minimized, molecule  # noqa: E402

F64 = torch.float64


def _setup(name: str, seeds=(0, 1, 2), cartesian_rings: bool = True):
    """``(mol, ic, x: (len(seeds), n, 3))``: RDKit embeddings of a molecule (mol keeps them as
    conformers 0, 1, ...)."""
    from rdkit.Chem import AllChem

    mol, n, bonds, Z = molecule(MOLECULES[name])
    ids = AllChem.EmbedMultipleConfs(mol, numConfs=len(seeds), randomSeed=seeds[0])
    assert len(ids) == len(seeds)
    x = torch.tensor(np.stack([c.GetPositions() for c in mol.GetConformers()]), dtype=F64)
    ic = InternalCoordinates(build_zmatrix(n, bonds, Z, cartesian_rings))
    return mol, ic, x


def _linear_setup(name: str):
    """``(ic, x: (24, n, 3))``: minimized conformers of a linear group of tests/test_zmatrix.py,
    and the Z-matrix around their straight angles."""
    mol, x = minimized(LINEAR[name])
    _, n, bonds, Z = molecule(LINEAR[name])
    x = torch.tensor(x, dtype=F64)
    return InternalCoordinates(build_zmatrix(n, bonds, Z, straight=straight_angles(x, bonds))), x


def _skew(w: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(w[..., 0])
    return torch.stack([torch.stack([z, -w[..., 2], w[..., 1]], -1),
                        torch.stack([w[..., 2], z, -w[..., 0]], -1),
                        torch.stack([-w[..., 1], w[..., 0], z], -1)], -2)  # fmt: skip


def _rigid_motions(B: int, g: torch.Generator):
    Q = torch.linalg.qr(torch.randn(B, 3, 3, generator=g, dtype=F64))[0]
    Q = Q * torch.det(Q)[:, None, None]  # det +1 (3x3: negating flips the sign)
    return Q, 10 * torch.randn(B, 1, 3, generator=g, dtype=F64)


def _assert_rotations(R: torch.Tensor) -> None:
    eye = torch.eye(3, dtype=R.dtype).expand_as(R)
    torch.testing.assert_close(R.mT @ R, eye, atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.det(R), torch.ones(R.shape[:-2], dtype=R.dtype),
                               atol=1e-12, rtol=0)  # fmt: skip


@pytest.mark.parametrize("name", list(MOLECULES))
def test_round_trip_of_rigidly_moved_conformers(name):
    """Catches any mismatch between `forward` and `inverse` (q's layout, NeRF's torsion sign,
    the root frame, the ring block's frame): x -> (R, q) -> x is the centred x to 1e-10 for
    rotated and translated conformers, with extra batch dimensions; R is a rotation."""
    mol, ic, x = _setup(name)
    g = torch.Generator().manual_seed(1)
    Q, t = _rigid_motions(len(x), g)
    y = x @ Q.mT + t
    R, q = ic(y)
    assert R.shape == (len(x), 3, 3) and q.shape == (len(x), 3 * ic.n_atoms - 6) == (len(x), ic.dim)
    _assert_rotations(R)
    back = ic.inverse(R, q)
    torch.testing.assert_close(back, y - y.mean(-2, keepdim=True), atol=1e-10, rtol=0)
    # (2, B, n, 3) batches: the same, elementwise
    R2, q2 = ic(torch.stack([y, x]))
    torch.testing.assert_close(R2[0], R, atol=1e-13, rtol=0)
    torch.testing.assert_close(ic.inverse(R2, q2)[1], x - x.mean(-2, keepdim=True),
                               atol=1e-10, rtol=0)  # fmt: skip


@pytest.mark.parametrize("name", list(MOLECULES))
def test_forward_inverts_inverse_on_new_coordinates(name):
    """Catches a bijection that only round-trips its own outputs: random orientations and
    q with every torsion redrawn in (-pi, pi), bonds and angles perturbed, the ring block
    moved, map back to themselves (to 1e-9)."""
    mol, ic, x = _setup(name, seeds=(3, 4))
    g = torch.Generator().manual_seed(2)
    q = ic(x)[1]
    nb, na, nt, nc = ic.n_bonds, ic.n_angles, ic.n_torsions, ic.n_block
    bonds, theta, phi, block = ic.split(q)
    bonds = bonds * (1 + 0.05 * torch.randn(bonds.shape, generator=g))
    theta = theta + 0.05 * torch.randn(theta.shape, generator=g)
    phi = (2 * torch.rand(phi.shape, generator=g) - 1) * math.pi
    block = block + 0.05 * torch.randn(block.shape, generator=g)
    q = torch.cat([bonds, theta, phi, block], -1)
    assert q.shape[-1] == nb + na + nt + nc
    R = random_rotation(len(q), F64, generator=g)
    R2, q2 = ic(ic.inverse(R, q))
    torch.testing.assert_close(R2, R, atol=1e-9, rtol=0)
    torch.testing.assert_close(q2, q, atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", list(MOLECULES))
def test_q_means_rdkit_bonds_angles_and_dihedrals(name):
    """Catches a wrong atom in a coordinate or a torsion sign convention other than RDKit's
    (IUPAC): each row's bond |i - j|, angle i-j-k and torsion i-j-k-l, the root's two bonds
    and angle, and the block's coordinates in the frame (a0; a1 - a0; a2 in the xy plane)."""
    mol, ic, x = _setup(name, seeds=(5,))
    conf = mol.GetConformer()
    zm = ic.zmatrix
    R, q = ic(x)
    bonds, theta, phi, block = (t[0].numpy() for t in ic.split(q))
    a0, a1, a2 = zm.root
    other = a1 if zm.root_bond == a0 else a0
    np.testing.assert_allclose(bonds[:2], [rdMolTransforms.GetBondLength(conf, a0, a1),
                               rdMolTransforms.GetBondLength(conf, a2, zm.root_bond)],
                               atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(
        theta[0], rdMolTransforms.GetAngleRad(conf, a2, zm.root_bond, other), atol=1e-12
    )
    for m, (i, j, k, l) in enumerate(zm.rows):
        np.testing.assert_allclose(bonds[m + 2], rdMolTransforms.GetBondLength(conf, i, j),
                                   atol=1e-12)  # fmt: skip
        np.testing.assert_allclose(theta[m + 1], rdMolTransforms.GetAngleRad(conf, i, j, k),
                                   atol=1e-12)  # fmt: skip
        np.testing.assert_allclose(phi[m], rdMolTransforms.GetDihedralRad(conf, i, j, k, l),
                                   atol=1e-10)  # fmt: skip
    # the block by hand: Gram-Schmidt of a1 - a0 and a2 - a0
    p = conf.GetPositions()
    e1 = (p[a1] - p[a0]) / np.linalg.norm(p[a1] - p[a0])
    v = p[a2] - p[a0] - ((p[a2] - p[a0]) @ e1) * e1
    e2 = v / np.linalg.norm(v)
    frame = np.stack([e1, e2, np.cross(e1, e2)], 1)
    np.testing.assert_allclose(R[0].numpy(), frame, atol=1e-12)
    want = ((p[list(zm.cartesian)] - p[a0]) @ frame).reshape(-1)
    np.testing.assert_allclose(block, want, atol=1e-12)


@pytest.mark.parametrize("name, cartesian_rings", [(name, True) for name in MOLECULES]
                         + [("cyclohexanol", False)])  # fmt: skip
def test_log_volume_is_the_log_jacobian_of_the_inverse(name, cartesian_rings):
    """Catches any error in ``log J``: a missing ``1.5 log n`` (the centre of mass), a bond
    power other than 2, sin of the wrong angles, a ring block that is not volume preserving.
    log J is log |det d z / d(omega, q)| of (omega, q) -> H^T inverse(R0 expm([omega]x), q)
    at omega = 0 by autograd (Haar measure has unit density in exponential coordinates at
    the identity, in the metric where a turn by a has length a)."""
    mol, ic, x = _setup(name, seeds=(6, 7), cartesian_rings=cartesian_rings)
    n = ic.n_atoms
    H = helmert_basis(n, F64)
    R0, q0 = ic(x)
    for b in range(len(x)):

        def z_of(v, b=b):
            R = R0[b] @ torch.linalg.matrix_exp(_skew(v[:3]))
            return (H.mT @ ic.inverse(R, v[3:])).reshape(-1)

        v0 = torch.cat([torch.zeros(3, dtype=F64), q0[b]])
        jac = torch.autograd.functional.jacobian(z_of, v0)
        assert jac.shape == (3 * (n - 1), 3 * (n - 1))
        sign, logdet = torch.linalg.slogdet(jac)
        assert sign != 0
        lv = ic.log_volume(q0[b])
        # the power of this check: 1e-8 against the 1.5 log n = 4.6 of 22 atoms, or
        # a log bond (about 0.1 nats for a C-H bond, 2 log 1.09)
        assert abs(lv.item() - logdet.item()) < 1e-8, (lv.item(), logdet.item())
        assert abs(1.5 * math.log(n)) > 1e-3 and abs(2 * math.log(1.09)) > 1e-3


def test_so3_volume_is_8_pi_squared_in_the_metric_of_log_volume():
    """Catches a Haar constant in another metric (pi^2 for unit quaternions' S^3 / 2, or 2
    pi^2): the Haar density in exponential coordinates, |det| of R^T dR / d omega (by
    autograd), integrated over the ball |omega| <= pi by Gauss-Legendre, is 8 pi^2 and its
    radial form is 2 (1 - cos r) / r^2."""
    g = torch.Generator().manual_seed(3)

    def density(w):
        dR = torch.autograd.functional.jacobian(lambda v: torch.linalg.matrix_exp(_skew(v)), w)
        R = torch.linalg.matrix_exp(_skew(w))
        A = torch.einsum("ba,bci->aci", R, dR)  # R^T dR/dw_i: skew, their vee's columns
        J = torch.stack([A[2, 1], A[0, 2], A[1, 0]], 0)
        return torch.det(J).abs()

    nodes, weights = np.polynomial.legendre.leggauss(24)
    r = torch.tensor((nodes + 1) * math.pi / 2, dtype=F64)
    vals = []
    for ri in r:
        u = torch.randn(3, generator=g, dtype=F64)
        d = density(ri * u / u.norm())
        assert abs(d.item() - 2 * (1 - math.cos(ri)) / ri**2) < 1e-10
        vals.append(4 * math.pi * ri**2 * d)
    volume = math.pi / 2 * sum(w * v for w, v in zip(weights, vals))
    assert abs(math.log(volume) - LOG_SO3_VOLUME) < 1e-10


def test_q_is_invariant_to_rigid_motions_and_the_mirror_negates_torsions():
    """Catches a q that sees the frame or the centre, and a hand carried anywhere but the
    torsions' signs and the block's third axis: under a rotation and translation q is
    unchanged and R turns with the molecule; in the mirror image (z -> -z) bonds, angles and
    the block's first two axes are unchanged, torsions and the block's third axis negate."""
    for name in ("ala2", "cyclohexanol"):
        mol, ic, x = _setup(name)
        g = torch.Generator().manual_seed(4)
        Q, t = _rigid_motions(len(x), g)
        R, q = ic(x)
        R2, q2 = ic(x @ Q.mT + t)
        torch.testing.assert_close(q2, q, atol=1e-10, rtol=0)
        torch.testing.assert_close(R2, Q @ R, atol=1e-10, rtol=0)
        Rm, qm = ic(x * torch.tensor([1.0, 1.0, -1.0], dtype=F64))
        _assert_rotations(Rm)
        b, a, p, c = ic.split(q)
        bm, am, pm, cm = ic.split(qm)
        torch.testing.assert_close(bm, b, atol=1e-12, rtol=0)
        torch.testing.assert_close(am, a, atol=1e-12, rtol=0)
        # torsions in (-pi, pi]: compare on the circle (pi is its own negative)
        torch.testing.assert_close(torch.sin(pm), -torch.sin(p), atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.cos(pm), torch.cos(p), atol=1e-12, rtol=0)
        assert (torch.sin(p).abs() > 0.1).any()  # some torsions are not 0 or pi
        c, cm = c.unflatten(-1, (-1, 3)), cm.unflatten(-1, (-1, 3))
        torch.testing.assert_close(cm, c * torch.tensor([1.0, 1.0, -1.0]), atol=1e-12, rtol=0)
        if name == "cyclohexanol":
            assert c[..., 2].abs().max() > 0.1  # a puckered ring: the check has power


def test_straight_angles_give_finite_coordinates_and_are_refused_by_check_angles():
    """Catches NaN from a straight angle (the torsion about it and log sin(theta) are
    undefined): with an angle of exactly 180 degrees, in a row or at the root, q and
    log_volume are finite and the angle is clamped to pi - EPS (log sin = log EPS), the
    gradient of a row's straight angle is finite; `check_angles` names the angle's atoms."""
    zm = build_zmatrix(4, [(0, 1), (1, 2), (2, 3)])
    assert zm.root == (1, 0, 2) and zm.root_bond == 1 and zm.rows == ((3, 2, 1, 0),)
    ic = InternalCoordinates(zm)
    row_straight = torch.tensor([[[0.0, 1.2, 0.0], [0.0, 0.0, 0.0], [1.5, 0.0, 0.0],
                                  [3.0, 0.0, 0.0]]], requires_grad=True)  # fmt: skip
    root_straight = torch.tensor([[[-1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.5, 0.0, 0.0],
                                   [2.0, 1.0, 0.0]]])  # fmt: skip
    for x, m in ((row_straight, 1), (root_straight, 0)):
        q = ic(x)[1]
        lv = ic.log_volume(q)
        assert torch.isfinite(q).all() and torch.isfinite(lv).all()
        assert abs(ic.split(q)[1][0, m].item() - (math.pi - EPS)) < 1e-12
        # log J = 2 sum log b + sum log sin theta - 1.5 log 4, with sin(pi - EPS) = EPS
        b, theta = ic.split(q)[0][0], ic.split(q)[1][0]
        want = 2 * b.log().sum() + theta.sin().log().sum() - 1.5 * math.log(4)
        assert abs(lv.item() - want.item()) < 1e-12 and lv.item() < math.log(EPS) + 5
    (ic(row_straight)[1].sum() + ic.log_volume(ic(row_straight)[1]).sum()).backward()
    assert torch.isfinite(row_straight.grad).all()
    with pytest.raises(ValueError, match=r"angle 3-2-1 reaches 180\.0 degrees in 1 molecules"):
        ic.check_angles(row_straight.detach())
    with pytest.raises(ValueError, match=r"angle 2-1-0 reaches 180\.0 degrees"):
        ic.check_angles(root_straight)
    # within the margin, not only exactly straight; and an angle near 0
    bent = row_straight.detach().clone()
    bent[0, 3] = torch.tensor([1.5 + 1.5 * math.cos(math.radians(3)),
                               1.5 * math.sin(math.radians(3)), 0.0])  # fmt: skip
    with pytest.raises(ValueError, match=r"angle 3-2-1 reaches 177\.0 degrees"):
        ic.check_angles(bent)
    bent[0, 3] = torch.tensor([1.5 - 1.5 * math.cos(math.radians(4)),
                               1.5 * math.sin(math.radians(4)), 0.0])  # fmt: skip
    with pytest.raises(ValueError, match=r"angle 3-2-1 reaches 4\.0 degrees"):
        ic.check_angles(bent)
    ic.check_angles(bent, margin_deg=3.0)  # outside a smaller margin: accepted


def test_check_angles_accepts_real_conformers():
    """Catches a guard that refuses ordinary molecules (e.g. degrees against radians)."""
    for name in MOLECULES:
        mol, ic, x = _setup(name)
        ic.check_angles(x)


def _haar_statistics(R: torch.Tensor) -> torch.Tensor:
    """``(m, 20)``: R's 9 entries (mean 0), their squares (mean 1/3), tr R (mean 0) and
    tr(R)^2 (mean 1, the character of an irreducible representation)."""
    tr = R.diagonal(dim1=-2, dim2=-1).sum(-1)
    return torch.cat([R.flatten(1), R.flatten(1) ** 2, tr[:, None], tr[:, None] ** 2], 1)


HAAR_MEANS = torch.tensor([0.0] * 9 + [1 / 3] * 9 + [0.0, 1.0], dtype=F64)


def _is_haar(R: torch.Tensor) -> bool:
    s = _haar_statistics(R)
    return all(abs(s[:, c].mean().item() - HAAR_MEANS[c].item()) <= mc_tolerance(s[:, c])
               for c in range(s.shape[1]))  # fmt: skip


def test_random_rotation_is_haar():
    """Catches a non-uniform orientation sampler (the density of the orientation is taken as
    1 / 8 pi^2): Haar moments within 4 standard errors. Power: two plausible wrong samplers
    fail the same check, Euler angles drawn uniformly (E[R_33^2] = 1/2) and a uniform axis
    with a uniform angle (E[tr R] = 1)."""
    m = 20_000
    g = torch.Generator().manual_seed(5)
    R = random_rotation(m, F64, generator=g)
    assert R.shape == (m, 3, 3) and R.dtype == F64
    _assert_rotations(R)
    assert _is_haar(R)
    # reproducible with a generator
    torch.testing.assert_close(
        random_rotation(4, F64, generator=torch.Generator().manual_seed(9)),
        random_rotation(4, F64, generator=torch.Generator().manual_seed(9)),
    )
    # the power guard
    a, c = (2 * math.pi * torch.rand(m, generator=g, dtype=F64) for _ in range(2))
    b = math.pi * torch.rand(m, generator=g, dtype=F64)
    e3 = torch.tensor([0.0, 0.0, 1.0], dtype=F64).expand(m, 3)
    e1 = torch.tensor([1.0, 0.0, 0.0], dtype=F64).expand(m, 3)
    euler = (torch.linalg.matrix_exp(_skew(a[:, None] * e3))
             @ torch.linalg.matrix_exp(_skew(b[:, None] * e1))
             @ torch.linalg.matrix_exp(_skew(c[:, None] * e3)))  # fmt: skip
    assert not _is_haar(euler)
    axis = torch.randn(m, 3, generator=g, dtype=F64)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    uniform_angle = torch.linalg.matrix_exp(
        _skew(math.pi * torch.rand(m, 1, generator=g, dtype=F64) * axis)
    )
    assert not _is_haar(uniform_angle)


# ------------------------------------------------------------------ linear groups
@pytest.mark.parametrize("name", list(LINEAR))
def test_linear_groups_round_trip_and_have_the_autograd_volume(name):
    """Catches a bijection or volume that fails where references are not bonded to j (a
    nitrile's N placed from an ortho carbon, torsions measured from atoms off the rod): x ->
    (R, q) -> x is the centred x to 1e-10 for rotated and translated minimized conformers,
    `check_angles` accepts them, and log J is log |det| of the inverse's Jacobian by autograd
    to 1e-8 (as above)."""
    ic, x = _linear_setup(name)
    bonds = {frozenset(b) for b in molecule(LINEAR[name])[2]}
    assert any(frozenset(r[1:3]) not in bonds for r in ic.zmatrix.rows)  # the case arises
    g = torch.Generator().manual_seed(8)
    Q, t = _rigid_motions(len(x), g)
    y = x @ Q.mT + t
    R, q = ic(y)
    _assert_rotations(R)
    torch.testing.assert_close(ic.inverse(R, q), y - y.mean(-2, keepdim=True), atol=1e-10,
                               rtol=0)  # fmt: skip
    ic.check_angles(x)
    n = ic.n_atoms
    H = helmert_basis(n, F64)
    for b in range(2):

        def z_of(v, b=b):
            Rb = R[b] @ torch.linalg.matrix_exp(_skew(v[:3]))
            return (H.mT @ ic.inverse(Rb, v[3:])).reshape(-1)

        jac = torch.autograd.functional.jacobian(z_of, torch.cat([torch.zeros(3, dtype=F64),
                                                                  q[b]]))  # fmt: skip
        sign, logdet = torch.linalg.slogdet(jac)
        assert sign != 0 and abs(ic.log_volume(q[b]).item() - logdet.item()) < 1e-8


def test_check_angles_refuses_a_torsion_reference_on_its_axis():
    """Catches a torsion i-j-k-l measured from an l on the axis j-k (undefined: it jumps as l
    crosses the axis, a silent garbage density, though every angle i-j-k is fine): a rod
    0-1-2 with row (4, 0, 1, 2) is refused, naming atom 4 and the angle 0-1-2, straight or 3
    degrees off; the same molecule with l = 3 off the axis is accepted; a torsion reference
    on the axis in under 1 % of broad random molecules is not refused."""
    x = torch.tensor([[[0.0, 0.0, 0.0], [1.5, 0.0, 0.0], [3.0, 0.0, 0.0], [1.5, 1.2, 0.0],
                       [-1.0, 1.0, 0.5]]], dtype=F64)  # fmt: skip
    rows = ((2, 1, 3, 0), (4, 0, 1, 2))
    ic = InternalCoordinates(ZMatrix(5, (1, 0, 3), 1, rows=rows))
    theta = torch.rad2deg(ic.split(ic(x)[1])[1])
    assert ((theta > 15) & (theta < 165)).all()  # the power: every angle i-j-k is fine
    with pytest.raises(ValueError, match=r"torsion reference of atom 4: the angle 0-1-2 "
                       r"reaches 180\.0 degrees in 1 molecules.*straight_angles"):  # fmt: skip
        ic.check_angles(x)
    bent = x.clone()
    bent[0, 2] = torch.tensor([1.5 + 1.5 * math.cos(math.radians(3)),
                               1.5 * math.sin(math.radians(3)), 0.0])  # fmt: skip
    with pytest.raises(ValueError, match=r"the angle 0-1-2 reaches 177\.0 degrees"):
        ic.check_angles(bent)
    InternalCoordinates(ZMatrix(5, (1, 0, 3), 1, rows=((2, 1, 3, 0), (4, 0, 1, 3)))
                        ).check_angles(x)  # fmt: skip
    g = torch.Generator().manual_seed(9)
    random = torch.randn(4000, 5, 3, generator=g, dtype=F64)
    theta = torch.rad2deg(ic.split(ic(random)[1])[1])
    random = random[((theta > 10) & (theta < 170)).all(-1)]
    axis = _angle_deg(random[:, 0] - random[:, 1], random[:, 2] - random[:, 1])
    assert 0 < ((axis < 5) | (axis > 175)).sum() < 0.01 * len(random)
    ic.check_angles(random)


def _angle_deg(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    cos = (u * v).sum(-1) / u.norm(dim=-1) / v.norm(dim=-1)
    return torch.rad2deg(torch.arccos(cos.clamp(-1, 1)))


@pytest.mark.parametrize("name", list(LINEAR))
def test_check_angles_points_a_linear_group_to_straight_angles(name):
    """Catches an error that sends a nitrile or alkyne to the Cartesian model (issue 46: the
    new Z-matrix handles them): the graph-only Z-matrix on minimized conformers is refused
    with advice to build it around straight_angles, not --geometry cartesian; a linear
    molecule (HC#CH) is refused as linear."""
    _, x = _linear_setup(name)
    _, n, bonds, Z = molecule(LINEAR[name])
    with pytest.raises(ValueError, match=r"straight line \(a linear group.*straight_angles") as e:
        InternalCoordinates(build_zmatrix(n, bonds, Z)).check_angles(x)
    assert "cartesian" not in str(e.value)
    _, xa = minimized("C#C", k=4)
    _, n, bonds, Z = molecule("C#C")
    with pytest.raises(ValueError, match=r"this molecule is linear .*--geometry cartesian"):
        InternalCoordinates(build_zmatrix(n, bonds, Z)).check_angles(torch.tensor(xa))
