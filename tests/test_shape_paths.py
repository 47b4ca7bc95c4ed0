"""The two geometries' conditional paths between shapes (`grassflow.manifolds.shape_paths`),
checked against independent computations: finite differences, the Grassmann distance, the
Riccati equation of the SPD geometric mean, and group actions."""

import math

import pytest
import torch

from grassflow.manifolds import Grassmann
from grassflow.manifolds.alignment import align_pairs, procrustes
from grassflow.manifolds.shape_paths import (
    RANK_TOL,
    bundle_path,
    check_full_rank,
    horizontal_part,
    polar,
    shape_path,
    straight_path,
)
from grassflow.training.shape_matching import cfm_objective

F64 = torch.float64


def _clouds(B, n, d, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(B, n, d, generator=g, dtype=F64)
    return x - x.mean(-2, keepdim=True)


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))[0]
    return Q @ torch.diag(torch.tensor([1.0] * (d - 1) + [-1.0], dtype=F64))  # a reflection


@pytest.mark.parametrize("n,d", [(4, 2), (13, 3), (6, 3)])
def test_bundle_path_ends_at_both_shapes(n, d):
    """Catches a wrong frame transport or SPD end point: x_0 = x0 exactly, and x_1 has
    x1's shape (the same n x n Gram matrix), in every dimension tried."""
    x0, x1 = _clouds(6, n, d, 0), _clouds(6, n, d, 1, scale=2.0)
    one = torch.ones(6, dtype=F64)
    torch.testing.assert_close(bundle_path(x0, x1, 0 * one)[0], x0)
    end = bundle_path(x0, x1, one)[0]
    torch.testing.assert_close(end @ end.mT, x1 @ x1.mT)


def test_bundle_velocity_is_the_horizontal_part_of_the_derivative():
    """Catches a wrong dR/dt or dY/dt (e.g. mu^t for mu^(t/2)): the returned velocity equals
    the horizontal part of a central finite difference of x_t, and is horizontal."""
    x0, x1 = _clouds(5, 13, 3, 2), _clouds(5, 13, 3, 3, scale=1.5)
    t = torch.tensor([0.05, 0.3, 0.5, 0.77, 0.95], dtype=F64)
    xt, u = bundle_path(x0, x1, t)
    h = 1e-6
    fd = (bundle_path(x0, x1, t + h)[0] - bundle_path(x0, x1, t - h)[0]) / (2 * h)
    torch.testing.assert_close(u, horizontal_part(xt, fd), atol=1e-7, rtol=1e-6)
    C = xt.mT @ u
    torch.testing.assert_close(C, C.mT)
    assert (fd - u).abs().max() > 1e-3  # the projection removed a real rotation (test power)


def test_bundle_span_moves_on_the_grassmann_geodesic():
    """Catches a span path that is not the geodesic: the distance from [Y0] grows linearly,
    d([Y0], [Y_t]) = t d([Y0], [Y1]), and d([Y_t], [Y1]) = (1 - t) d([Y0], [Y1])."""
    n, d = 13, 3
    x0, x1 = _clouds(4, n, d, 4), _clouds(4, n, d, 5)
    t = torch.tensor([0.1, 0.4, 0.6, 0.9], dtype=F64)
    gr = Grassmann(d, n)
    Y0, Y1, Yt = polar(x0)[0], polar(x1)[0], polar(bundle_path(x0, x1, t)[0])[0]
    total = gr.dist(Y0, Y1)
    torch.testing.assert_close(gr.dist(Y0, Yt), t * total)
    torch.testing.assert_close(gr.dist(Yt, Y1), (1 - t) * total)


def test_bundle_metric_midpoint_is_the_geometric_mean():
    """Catches a metric path other than the affine-invariant geodesic (e.g. linear in G):
    at t = 1/2 the metric in the transported frame is G0 # G1, the SPD solution of the
    Riccati equation M G0^{-1} M = G1."""
    n, d = 9, 3
    x0, x1 = _clouds(3, n, d, 6), _clouds(3, n, d, 7, scale=3.0)
    half, one = torch.full((3,), 0.5, dtype=F64), torch.ones(3, dtype=F64)
    gr = Grassmann(d, n)
    Y0 = polar(x0)[0]
    frame = lambda t: gr.geodesic(Y0, polar(x1)[0], t)[0]  # noqa: E731
    metric = lambda Y, x: (Y.mT @ x) @ (Y.mT @ x).mT  # noqa: E731
    G0 = metric(Y0, x0)
    G1 = metric(frame(one), x1)
    M = metric(frame(half), bundle_path(x0, x1, half)[0])
    torch.testing.assert_close(M @ torch.linalg.solve(G0, M), G1)
    linear = 0.5 * (G0 + G1)
    assert (linear @ torch.linalg.solve(G0, linear) - G1).abs().max() > 1e-2  # power


def test_bundle_path_is_invariant_to_rotating_x1_and_equivariant_in_both():
    """Catches a path that depends on x1's orientation (the Grassmann path must not), or
    one that breaks O(d) equivariance: rotating both clouds rotates the path."""
    x0, x1 = _clouds(4, 7, 3, 8), _clouds(4, 7, 3, 9)
    t = torch.tensor([0.2, 0.5, 0.7, 1.0], dtype=F64)
    Q, R = _orthogonal(3, 10), _orthogonal(3, 11)
    xt, u = bundle_path(x0, x1, t)
    torch.testing.assert_close(bundle_path(x0, x1 @ R, t)[0], xt)
    yt, v = bundle_path(x0 @ Q, x1 @ Q, t)
    torch.testing.assert_close(yt, xt @ Q)
    torch.testing.assert_close(v, u @ Q)
    assert torch.allclose(xt.mean(-2), torch.zeros_like(xt.mean(-2)), atol=1e-12)


def test_straight_path_between_aligned_clouds_is_horizontal():
    """The Cartesian geometry's premise: after Kabsch alignment (x0^T x1 symmetric) the
    straight line's velocity has no rotation part; without alignment it has one."""
    x0, x1 = _clouds(4, 8, 3, 12), _clouds(4, 8, 3, 13)
    t = torch.full((4,), 0.4, dtype=F64)
    aligned = x1 @ procrustes(x0, x1)
    xt, u = straight_path(x0, aligned, t)
    torch.testing.assert_close(horizontal_part(xt, u), u)
    xt, u = straight_path(x0, x1, t)
    assert (horizontal_part(xt, u) - u).abs().max() > 1e-2


def test_horizontal_part_is_a_projection_along_rotations():
    """Catches a wrong Sylvester solve: the result is horizontal, projecting twice changes
    nothing, and what was removed is x A with A skew."""
    x, u = _clouds(5, 6, 3, 14), _clouds(5, 6, 3, 15)
    h = horizontal_part(x, u)
    C = x.mT @ h
    torch.testing.assert_close(C, C.mT)
    torch.testing.assert_close(horizontal_part(x, h), h)
    A = torch.linalg.lstsq(x, u - h).solution
    torch.testing.assert_close(A, -A.mT)
    torch.testing.assert_close(x @ A, u - h)


def test_shape_path_dispatch_and_bad_geometry():
    x0, x1 = _clouds(2, 5, 2, 16), _clouds(2, 5, 2, 17)
    t = torch.tensor([0.3, 0.6], dtype=F64)
    torch.testing.assert_close(shape_path("cartesian", x0, x1, t)[0], straight_path(x0, x1, t)[0])
    torch.testing.assert_close(shape_path("grassmann", x0, x1, t)[0], bundle_path(x0, x1, t)[0])
    with pytest.raises(ValueError, match="geometry must be one of"):
        shape_path("spherical", x0, x1, t)


def test_bundle_path_keeps_float32():
    x0, x1 = _clouds(3, 5, 2, 18).float(), _clouds(3, 5, 2, 19).float()
    xt, u = bundle_path(x0, x1, torch.rand(3))
    assert xt.dtype == u.dtype == torch.float32 and torch.isfinite(u).all()


def test_grassmann_objective_regresses_on_the_bundle_path():
    """Catches cfm_objective ignoring ``geometry``: with the same RNG state, the Grassmann
    loss is the mean squared distance of the field from the bundle path's velocity at the
    bundle path's point, which differs from the straight line's."""
    from grassflow.flows import ShapeFlow

    torch.manual_seed(0)
    model = ShapeFlow(5, 2, hidden=8, layers=1).double()
    batch = _clouds(6, 5, 2, 20)
    losses = {}
    for geometry in ("cartesian", "grassmann"):
        torch.manual_seed(1)
        losses[geometry] = cfm_objective(model, batch, geometry=geometry)[0]
    # the same draws, recomputed by hand for the Grassmann path
    torch.manual_seed(1)
    z = torch.randn(6, 4, 2, dtype=F64)
    x0 = model.clouds(z * model.prior_std)
    from grassflow.manifolds.alignment import assignment, orthogonal_cost

    x0 = x0[assignment(orthogonal_cost(x0, batch)).argsort()]
    x1 = align_pairs(x0, batch)
    t = torch.rand(6, dtype=F64)
    xt, ut = bundle_path(x0, x1, t)
    expected = (model.field(t, xt) - ut).square().sum((-2, -1)).mean()
    torch.testing.assert_close(losses["grassmann"], expected)
    assert not math.isclose(losses["grassmann"].item(), losses["cartesian"].item(), rel_tol=1e-3)
    with pytest.raises(ValueError, match="geometry"):
        cfm_objective(model, batch, geometry="hyperbolic")


def test_rank_deficient_clouds_are_refused_by_name(tmp_path):
    """Catches a Grassmann path that silently regresses on a flat cloud's noise direction
    (its polar factor divides by a near-zero eigenvalue) and a guard that refuses clouds
    as anisotropic as QM9's (eigenvalue ratio >= 0.016)."""
    from grassflow.flows import ShapeFlow
    from grassflow.training import TrainConfig, fit_shape_flow

    x0, x1 = _clouds(4, 6, 3, 21), _clouds(4, 6, 3, 22)
    flat = x1.clone()
    flat[2, :, 2] = 1e-5 * flat[2, :, 2]  # eigenvalue ratio ~1e-10: a planar molecule
    with pytest.raises(ValueError, match=r"rank 3.*1 of 4.*\[2\].*cartesian"):
        bundle_path(x0, flat, torch.full((4,), 0.5, dtype=F64))
    straight_path(x0, flat, torch.full((4,), 0.5, dtype=F64))  # defined for any cloud
    thin = x1.clone()
    thin[:, :, 2] *= 0.1  # ratio ~1e-2 times the clouds' own: still a valid shape
    lam = torch.linalg.eigvalsh(thin.mT @ thin)
    assert (lam[:, 0] / lam[:, -1]).min() > 100 * RANK_TOL
    check_full_rank(thin)
    assert torch.isfinite(bundle_path(x0, thin, torch.rand(4, dtype=F64))[1]).all()
    # training refuses before its first step, and writes nothing
    model = ShapeFlow(6, 3, hidden=8, layers=1, geometry="grassmann").double()
    with pytest.raises(ValueError, match="training clouds of rank 3"):
        fit_shape_flow(model, flat, None, tmp_path / "run", TrainConfig(iterations=1),
                       progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()
