import math

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions import MatrixGaussianPrior, UniformGrassmann
from grassflow.manifolds import Grassmann, orthonormality_error


def make_prior(k, D, sigma, anisotropic=False):
    gr = Grassmann(k, D)
    M = gr.random()
    U, V = sigma**2 * torch.eye(D), torch.eye(k)
    if anisotropic:
        A, B = torch.randn(D, D), torch.randn(k, k)
        U = U + 0.3 * sigma**2 * A @ A.T / D
        V = V + 0.2 * B @ B.T / k
    return gr, MatrixGaussianPrior(gr, mean=M, row_cov=U, col_cov=V)


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (2, 3), (3, 5)])
@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_prior_integrates_to_one(k, D, sigma):
    # int p dvol = V_Gr * E_uniform[p]
    gr, prior = make_prior(k, D, sigma, anisotropic=True)
    w = torch.exp(prior.log_prob(gr.random(200_000)) + gr.log_volume())
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (2, 3)])
def test_prior_density_matches_its_sampler(k, D):
    # E_samples[f] == V_Gr * E_uniform[f p] for a test function of the projector
    gr, prior = make_prior(k, D, 0.6, anisotropic=True)
    c = torch.randn(D)

    def f(Y):
        return ((c[:, None] * Y).sum(-2) ** 2).sum(-1)  # c^T Y Y^T c

    fs = f(prior.sample((100_000,)))
    U = gr.random(400_000)
    fw = f(U) * torch.exp(prior.log_prob(U) + gr.log_volume())
    tol = math.hypot(mc_tolerance(fs), mc_tolerance(fw))
    assert fs.mean().item() == pytest.approx(fw.mean().item(), abs=tol)


def test_prior_matches_closed_form_on_gr13():
    # Gr(1,3), M = e1, U = s^2 I: xi is isotropic in the plane, preimage radii 2 tan(t/2) and
    # 2 cot(t/2), Jacobian (1 + r^2/4)^-2, t = angle between the line and e1
    s = 0.5
    gr = Grassmann(1, 3)
    prior = MatrixGaussianPrior(gr, torch.eye(3, 1), s**2 * torch.eye(3), torch.eye(1))
    Y = gr.random(50)
    t = torch.acos(Y[:, 0, 0].abs())
    p = 0
    for r in (2 * torch.tan(t / 2), 2 / torch.tan(t / 2)):
        p = p + torch.exp(-(r**2) / (2 * s**2)) / (2 * math.pi * s**2) * (1 + r**2 / 4) ** 2
    assert torch.allclose(prior.log_prob(Y), torch.log(p), atol=1e-10)


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (3, 13), (2, 3)])
def test_prior_log_prob_is_representative_invariant(k, D):
    gr, prior = make_prior(k, D, 0.5, anisotropic=True)
    Y = prior.sample((20,))
    Q = random_orthogonal(k)
    assert torch.allclose(prior.log_prob(Y @ Q), prior.log_prob(Y), atol=1e-9)
    assert torch.allclose(prior.log_prob(-Y), prior.log_prob(Y), atol=1e-9)


def test_prior_is_finite_at_its_mean_and_antipode():
    gr = Grassmann(2, 4)
    M = torch.eye(4, 2)
    prior = MatrixGaussianPrior(gr, M, 0.09 * torch.eye(4), torch.eye(2))
    lp = prior.log_prob(torch.stack([M, -M, M @ random_orthogonal(2)]))
    assert torch.isfinite(lp).all()
    assert torch.allclose(lp, lp[0].expand(3))
    # the mode: the Gaussian density at xi = 0 times Jacobian 1
    assert lp[0].item() == pytest.approx(-4 / 2 * math.log(2 * math.pi * 0.09), rel=1e-9)


def test_prior_samples_are_orthonormal_and_rsample_differentiable():
    gr = Grassmann(3, 13)
    U = torch.eye(13).requires_grad_(True)
    prior = MatrixGaussianPrior(gr, torch.eye(13, 3), U, torch.eye(3))
    Y = prior.rsample((16,))
    assert orthonormality_error(Y).max() < 1e-12
    Y.sum().backward()
    assert U.grad is not None and torch.isfinite(U.grad).all()


def test_prior_log_prob_gradient_is_finite():
    gr, prior = make_prior(3, 13, 0.3)
    Y = prior.sample((32,)).requires_grad_(True)
    prior.log_prob(Y).sum().backward()
    assert torch.isfinite(Y.grad).all()


def test_uniform():
    gr = Grassmann(2, 4)
    u = UniformGrassmann(gr, dtype=torch.float64)
    Y = u.sample((5,))
    assert Y.shape == (5, 4, 2)
    assert torch.allclose(u.log_prob(Y), torch.full((5,), -gr.log_volume()))
    assert u.entropy().item() == pytest.approx(gr.log_volume())


def test_prior_bad_input():
    gr = Grassmann(2, 4)
    with pytest.raises(ValueError, match="positive definite"):
        MatrixGaussianPrior(gr, row_cov=-torch.eye(4))
    with pytest.raises(ValueError, match="symmetric"):
        MatrixGaussianPrior(gr, col_cov=torch.tensor([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"\(4, 4\)"):
        MatrixGaussianPrior(gr, row_cov=torch.eye(3))
    with pytest.raises(ValueError, match="orthonormal"):
        MatrixGaussianPrior(gr, mean=torch.ones(4, 2))
    with pytest.raises(ValueError, match="dtype"):
        MatrixGaussianPrior(gr, mean=torch.eye(4, 2), row_cov=torch.eye(4, dtype=torch.float32))
    prior = MatrixGaussianPrior(gr)
    with pytest.raises(ValueError, match="dtype"):
        prior.log_prob(gr.random(3, dtype=torch.float32))
    with pytest.raises(ValueError, match="shape"):
        prior.log_prob(torch.randn(3, 4, 3))
