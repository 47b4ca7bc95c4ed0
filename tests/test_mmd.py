"""Unbiased MMD^2 on Gr(k, D) with the chordal Gaussian kernel."""

import math

import pytest
import torch

from grassflow.data.textures import sample_texture
from grassflow.distributions import MatrixGaussianPrior, UniformGrassmann
from grassflow.manifolds import Grassmann
from grassflow.metrics import median_bandwidth, mmd2, pairwise_chordal_dist2

DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _prior(k, D, var=0.5):
    gr = Grassmann(k, D)
    return MatrixGaussianPrior(
        gr, mean=torch.eye(D, k, dtype=DT), row_cov=var * torch.eye(D, dtype=DT)
    )


def _null_se(X, Y, h):
    """Standard error of MMD^2_u under H0 for equal sizes (Gretton et al. 2012, §6):
    Var = 2 E[h^2] / (n (n-1)) for the degenerate kernel h of the paired U-statistic."""
    n = X.shape[0]
    kern = lambda A, B: torch.exp(-pairwise_chordal_dist2(A, B) / (2 * h**2))
    Kxy = kern(X, Y)
    H = kern(X, X) + kern(Y, Y) - Kxy - Kxy.T
    off = ~torch.eye(n, dtype=torch.bool)
    return math.sqrt(2 * H[off].square().mean().item() / (n * (n - 1)))


@pytest.mark.parametrize(
    "dist, k, D",
    [
        (_prior(1, 3), 1, 3),
        (_prior(2, 4), 2, 4),
        (UniformGrassmann(Grassmann(3, 7), dtype=DT), 3, 7),
    ],
)
def test_same_distribution_near_zero(dist, k, D):
    n = 400
    X, Y = dist.sample((n,), generator=_gen(0)), dist.sample((n,), generator=_gen(1))
    h = median_bandwidth(X, Y).item()
    se = _null_se(X, Y, h)
    assert abs(mmd2(X, Y).item()) < 4 * se


def test_different_distributions_positive():
    n = 400
    X = _prior(1, 3).sample((n,), generator=_gen(0))
    Y = UniformGrassmann(Grassmann(1, 3), dtype=DT).sample((n,), generator=_gen(1))
    Z = _prior(1, 3, var=0.1).sample((n,), generator=_gen(2))
    h = median_bandwidth(X, Y).item()
    assert mmd2(X, Y).item() > 10 * _null_se(X, Y, h)
    h = median_bandwidth(X, Z).item()
    assert mmd2(X, Z).item() > 10 * _null_se(X, Z, h)
    # two textures, at a bandwidth fine enough for their structure
    A = sample_texture("swissroll", n, seed=0, dtype=DT)
    B = sample_texture("2sines", n, seed=1, dtype=DT)
    assert mmd2(A, B, bandwidth=0.1).item() > 10 * _null_se(A, B, 0.1)


def test_texture_null():
    n = 400
    A = sample_texture("target", n, seed=0, dtype=DT)
    B = sample_texture("target", n, seed=1, dtype=DT)
    assert abs(mmd2(A, B, bandwidth=0.1).item()) < 4 * _null_se(A, B, 0.1)


def test_sign_flip_invariance_k1():
    X = _prior(1, 3).sample((50,), generator=_gen(0))
    Y = UniformGrassmann(Grassmann(1, 3), dtype=DT).sample((60,), generator=_gen(1))
    sx = torch.randint(0, 2, (50, 1, 1), generator=_gen(2)).to(DT) * 2 - 1
    sy = torch.randint(0, 2, (60, 1, 1), generator=_gen(3)).to(DT) * 2 - 1
    torch.testing.assert_close(mmd2(X * sx, Y * sy), mmd2(X, Y), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mmd2(-X, Y, 0.3), mmd2(X, Y, 0.3), rtol=1e-10, atol=1e-12)


def test_orthogonal_invariance_k2():
    X = _prior(2, 5).sample((40,), generator=_gen(0))
    Y = UniformGrassmann(Grassmann(2, 5), dtype=DT).sample((30,), generator=_gen(1))
    Qx = torch.linalg.qr(torch.randn(40, 2, 2, generator=_gen(2), dtype=DT))[0]
    Qy = torch.linalg.qr(torch.randn(30, 2, 2, generator=_gen(3), dtype=DT))[0]
    torch.testing.assert_close(mmd2(X @ Qx, Y @ Qy), mmd2(X, Y), rtol=1e-10, atol=1e-12)


def test_symmetric():
    X = _prior(2, 4).sample((30,), generator=_gen(0))
    Y = UniformGrassmann(Grassmann(2, 4), dtype=DT).sample((45,), generator=_gen(1))
    torch.testing.assert_close(mmd2(X, Y), mmd2(Y, X), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(mmd2(X, Y, 0.4), mmd2(Y, X, 0.4), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bandwidth", [None, 0.7])
def test_matches_double_loop(bandwidth):
    gr = Grassmann(2, 5)
    X = gr.random(4, generator=_gen(0), dtype=DT)
    Y = gr.random(5, generator=_gen(1), dtype=DT)
    Z = torch.cat([X, Y])
    if bandwidth is None:
        d = sorted(
            math.sqrt(gr.chordal_dist2(Z[i], Z[j]).item())
            for i in range(len(Z))
            for j in range(i + 1, len(Z))
        )
        h = d[(len(d) - 1) // 2]  # lower median
    else:
        h = bandwidth
    K = lambda a, b: math.exp(-gr.chordal_dist2(a, b).item() / (2 * h * h))
    n, m = len(X), len(Y)
    xx = sum(K(X[i], X[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    yy = sum(K(Y[i], Y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(K(X[i], Y[j]) for i in range(n) for j in range(m)) / (n * m)
    assert mmd2(X, Y, bandwidth).item() == pytest.approx(xx + yy - 2 * xy, rel=1e-12, abs=1e-14)
    if bandwidth is None:
        assert median_bandwidth(X, Y).item() == pytest.approx(h, rel=1e-12)


def test_pairwise_matches_manifold():
    gr = Grassmann(3, 6)
    X, Y = gr.random(7, generator=_gen(0), dtype=DT), gr.random(5, generator=_gen(1), dtype=DT)
    expected = gr.chordal_dist2(X[:, None], Y[None, :])
    torch.testing.assert_close(pairwise_chordal_dist2(X, Y), expected)


def test_differentiable_and_dtype():
    gr = Grassmann(1, 3)
    X = gr.random(20, generator=_gen(0), dtype=torch.float32).requires_grad_()
    Y = gr.random(20, generator=_gen(1), dtype=torch.float32)
    out = mmd2(X, Y)
    assert out.dtype == torch.float32 and out.shape == ()
    out.backward()
    assert torch.isfinite(X.grad).all() and X.grad.abs().sum() > 0


def test_errors():
    gr = Grassmann(1, 3)
    X, Y = gr.random(5, dtype=DT), gr.random(6, dtype=DT)
    with pytest.raises(ValueError, match="same Gr"):
        mmd2(X, Grassmann(1, 4).random(6, dtype=DT))
    with pytest.raises(ValueError, match="shape"):
        mmd2(X[0], Y)
    with pytest.raises(ValueError, match="at least 2"):
        mmd2(X[:1], Y)
    with pytest.raises(ValueError, match="not orthonormal"):
        mmd2(2 * X, Y)
    with pytest.raises(ValueError, match="dtype|float"):
        mmd2(X, Y.float())
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="bandwidth"):
            mmd2(X, Y, bad)
