import math

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.manifolds import Grassmann, orthonormality_error

CASES = [(1, 3), (2, 4), (2, 3), (3, 13), (3, 5)]


@pytest.mark.parametrize("k,D", CASES)
def test_random_is_orthonormal_and_uniform(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(20000)
    assert orthonormality_error(Y).max() < 1e-12
    # E[Y Y^T] = (k / D) I for the uniform distribution
    P = Y @ Y.mT
    mean = P.mean(0)
    tol = mc_tolerance(P[:, 0, 0])
    assert torch.allclose(mean, k / D * torch.eye(D), atol=max(tol, 1e-3) * 1.5)


@pytest.mark.parametrize("k,D", CASES)
def test_retraction_first_order(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(4)
    xi = gr.proju(Y, torch.randn(4, D, k))
    h = 1e-6
    fd = (gr.retr(Y, h * xi) - gr.retr(Y, -h * xi)) / (2 * h)
    assert torch.allclose(fd, xi, atol=1e-7)
    assert torch.allclose(gr.retr(Y, 0 * xi), Y)


@pytest.mark.parametrize("k,D", CASES)
def test_retr_is_orthonormal_and_equals_reparametrized_exp(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(8)
    xi = 2.0 * gr.proju(Y, torch.randn(8, D, k))
    X = gr.retr(Y, xi)
    assert orthonormality_error(X).max() < 1e-12
    U, s, Vh = torch.linalg.svd(xi, full_matrices=False)
    xi_exp = U @ torch.diag_embed(2 * torch.atan(s / 2)) @ Vh
    assert gr.same_subspace(gr.expmap(Y, xi_exp), X).all()


@pytest.mark.parametrize("k,D", CASES)
def test_inv_retr_inverts_retr_on_its_image(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(8)
    xi = gr.proju(Y, torch.randn(8, D, k))
    assert torch.allclose(gr.inv_retr(Y, gr.retr(Y, xi)), xi, atol=1e-9)


@pytest.mark.parametrize("k,D", CASES)
def test_cayley_preimages_all_map_to_the_subspace(k, D):
    gr = Grassmann(k, D)
    Y, X = gr.random(6), gr.random(6)
    Q = random_orthogonal(k)
    xis, s, valid = gr.cayley_preimages(Y, X @ Q)
    r = min(k, D - k)
    assert xis.shape[0] == 2**r and valid.all()
    for xi, si in zip(xis, s):
        assert (Y.mT @ xi).abs().max() < 1e-10  # horizontal
        assert gr.same_subspace(gr.retr(Y, xi), X, atol=1e-8).all()
        sv = torch.linalg.svdvals(xi)
        assert torch.allclose(sv.sort(-1).values, si.abs().sort(-1).values, atol=1e-8)
    # another base representative Y Q gives the same preimages, as lifts at Y Q: {xi Q}
    Q = random_orthogonal(k)
    xis2 = gr.cayley_preimages(Y @ Q, X)[0]
    gap = (xis2[None] - (xis @ Q)[:, None]).norm(dim=(-2, -1)).amin(1)
    assert gap.max() < 1e-8


@pytest.mark.parametrize("k,D", [(2, 4), (3, 13)])
def test_paper_inv_retr_depends_on_representative(k, D):
    # documents why grassflow sums over cayley_preimages instead
    gr = Grassmann(k, D)
    M, X = gr.random(50), gr.random(50)
    Q = random_orthogonal(k).expand(50, k, k)
    err = gr.proju(X, gr.retr(M, gr.inv_retr(M, X @ Q))).norm(dim=(-2, -1))
    assert err.max() > 1e-2


@pytest.mark.parametrize("k,D", CASES)
def test_exp_log_inverse(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(10)
    xi = gr.proju(Y, torch.randn(10, D, k))
    xi = xi / gr.norm(Y, xi)[:, None, None] * 1.2  # inside the injectivity radius pi/2
    X = gr.expmap(Y, xi)
    assert torch.allclose(gr.logmap(Y, X @ random_orthogonal(k)), xi, atol=1e-8)
    X2 = gr.random(10)
    assert gr.same_subspace(gr.expmap(Y, gr.logmap(Y, X2)), X2, atol=1e-8).all()


@pytest.mark.parametrize("k,D", CASES)
def test_dist_invariances(k, D):
    gr = Grassmann(k, D)
    Y, X = gr.random(10), gr.random(10)
    d = gr.dist(Y, X)
    R = torch.linalg.qr(torch.randn(D, D))[0]
    assert torch.allclose(gr.dist(Y @ random_orthogonal(k), X @ random_orthogonal(k)), d)
    assert torch.allclose(gr.dist(R @ Y, R @ X), d)
    assert torch.allclose(gr.dist(X, Y), d)
    assert torch.allclose(gr.dist(Y, Y), torch.zeros(10), atol=1e-7)
    # dist equals the norm of the logarithm
    assert torch.allclose(gr.norm(Y, gr.logmap(Y, X)), d, atol=1e-9)


def test_dist_small_and_right_angles_are_accurate():
    gr = Grassmann(1, 3)
    y = torch.tensor([[1.0], [0.0], [0.0]])
    for angle in (1e-9, 0.3, math.pi / 2):
        x = torch.tensor([[math.cos(angle)], [math.sin(angle)], [0.0]])
        assert gr.dist(y, x).item() == pytest.approx(angle, rel=1e-9)


@pytest.mark.parametrize(
    "k,D,expected", [(1, 3, 1.838), (2, 4, 2.983), (2, 3, 1.838), (3, 13, 3.215), (3, 12, 3.982)]
)
def test_log_volume(k, D, expected):
    assert Grassmann(k, D).log_volume() == pytest.approx(expected, abs=1e-3)


def test_log_volume_matches_sphere_area():
    # Gr(1, D) is RP^{D-1}: half the area of the unit sphere S^{D-1}
    for D in range(2, 8):
        area = 2 * math.pi ** (D / 2) / math.gamma(D / 2)
        assert Grassmann(1, D).log_volume() == pytest.approx(math.log(area / 2))


def test_from_point_cloud():
    gr = Grassmann(3, 13)
    P = torch.randn(5, 13, 3)
    P = P - P.mean(-2, keepdim=True)
    for method in ("qr", "eig"):
        Y, B = gr.from_point_cloud(P, method=method, return_factor=True)
        assert orthonormality_error(Y).max() < 1e-12
        assert torch.allclose(Y @ B, P, atol=1e-10)
        assert torch.allclose(torch.ones(1, 13) @ Y, torch.zeros(5, 1, 3), atol=1e-10)
    # qr: Gram-Schmidt, first column is the normalized first column of P
    Y = gr.from_point_cloud(P, "qr")
    assert torch.allclose(Y[..., 0], P[..., 0] / P[..., 0].norm(dim=-1, keepdim=True))
    # eig: descending eigenvalues of P P^T
    Y, B = gr.from_point_cloud(P, "eig", return_factor=True)
    lam = (B @ B.mT).diagonal(dim1=-2, dim2=-1)
    assert (lam[..., :-1] >= lam[..., 1:]).all()


def test_from_point_cloud_rejects_rank_deficient():
    gr = Grassmann(2, 4)
    P = torch.randn(4, 1) * torch.tensor([[1.0, 2.0]])  # collinear points
    with pytest.raises(ValueError, match="rank"):
        gr.from_point_cloud(P)
    with pytest.raises(ValueError, match="method"):
        gr.from_point_cloud(torch.randn(4, 2), method="svd")


def test_bad_input_errors():
    with pytest.raises(ValueError, match="1 <= k < D"):
        Grassmann(3, 3)
    gr = Grassmann(2, 4)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4, 2\)"):
        gr.check_point(torch.randn(4, 3))
    with pytest.raises(ValueError, match="orthonormal"):
        gr.check_point(torch.randn(4, 2))
    Y = gr.random(3)
    Y[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        gr.check_point(Y)
    with pytest.raises(ValueError, match="empty"):
        gr.check_point(torch.zeros(0, 4, 2))
    with pytest.raises(ValueError, match="floating"):
        gr.check_point(torch.zeros(4, 2, dtype=torch.int64))
