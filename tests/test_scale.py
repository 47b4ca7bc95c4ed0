"""The paper's QM9 scale estimator, its Gram decoder density, and the -ELBO bound."""

import math

import pytest
import torch

from conftest import mc_tolerance
from grassflow.distributions.cartesian import (
    cartesian_elbo,
    cartesian_log_prob_gram,
    random_orthogonal,
)
from grassflow.manifolds import Grassmann
from grassflow.nn.scale import GramDecoder, ScaleEstimator


def decoder(n, k, seed=0):
    torch.manual_seed(seed)
    dec = GramDecoder(ScaleEstimator(n, k, (16,), norm=None), init_tau=0.4, init_omega=0.5)
    with torch.no_grad():  # make the scales depend visibly on Y
        dec.estimator.head.weight.normal_(0, 0.5)
    return dec.double().eval()


def uniform_gr(k, n):
    return lambda Y: Y.new_full(Y.shape[:-2], -Grassmann(k, n).log_volume())


def o2_grid(m):
    """m rotations and m reflections, equally spaced: a quadrature for Haar on O(2)."""
    t = torch.arange(m, dtype=torch.float64) * (2 * math.pi / m)
    c, s = torch.cos(t), torch.sin(t)
    rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
    return torch.cat([rot, rot @ torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))])


def quadrature_log_prob(P, dec, m=256):
    """Exact log p(P) of the latent-orientation model, by quadrature over O(2)."""
    Q = o2_grid(m).view(2 * m, *([1] * (P.dim() - 2)), 2, 2)

    def gram(S, Y):
        return torch.logsumexp(dec.log_prob(Q.mT @ S @ Q, Y @ Q), 0) - math.log(2 * m)

    return cartesian_log_prob_gram(P, uniform_gr(2, P.shape[-2]), gram)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.filterwarnings("ignore:Singular sample")
def test_gram_decoder_normalizes(k):
    # importance sampling from a Wishart, whose density on SPD(k) torch knows in closed form
    torch.manual_seed(1)
    dec = decoder(4, k)
    Y = torch.linalg.qr(torch.randn(4, k, dtype=torch.float64))[0]
    W = torch.distributions.Wishart(
        df=torch.tensor(k + 1.5, dtype=torch.float64),
        covariance_matrix=0.7 * torch.eye(k, dtype=torch.float64),
    )
    S = W.sample((200_000,))
    with torch.no_grad():
        w = (dec.log_prob(S, Y.expand(len(S), 4, k)) - W.log_prob(S)).exp()
    assert abs(w.mean().item() - 1) < mc_tolerance(w)


def test_gram_decoder_sampler_matches_its_parameters():
    dec = decoder(4, 2)
    Y = torch.linalg.qr(torch.randn(4, 2, dtype=torch.float64))[0].expand(100_000, 4, 2)
    with torch.no_grad():
        S = dec.sample(Y, generator=torch.Generator().manual_seed(0))
        L = torch.linalg.cholesky(S)
        mu = dec.estimator(Y[:1])[0].log()
    a = torch.diagonal(L, dim1=-2, dim2=-1).log()
    assert torch.allclose(a.mean(0), mu, atol=0.01)
    assert torch.allclose(a.std(0), dec.log_tau.exp().detach(), rtol=0.02)
    assert abs(L[:, 1, 0].std().item() - dec.log_omega.exp().item()) < 0.01


def test_elbo_is_exact_for_an_equivariant_gram_density():
    # a Wishart with scale proportional to I is conjugation-invariant: the bound is tight
    W = torch.distributions.Wishart(
        df=torch.tensor(6.0, dtype=torch.float64), covariance_matrix=torch.eye(3).double()
    )
    P = torch.randn(7, 6, 3, dtype=torch.float64)
    exact = cartesian_log_prob_gram(P, uniform_gr(3, 6), lambda S, Y: W.log_prob(S))
    for iw in (False, True):
        bound = cartesian_elbo(P, uniform_gr(3, 6), lambda S, Y: W.log_prob(S), n_samples=3,
                               importance_weighted=iw)  # fmt: skip
        assert torch.allclose(bound, exact, atol=1e-10)


def test_elbo_below_iwae_below_exact():
    dec = decoder(3, 2)
    torch.manual_seed(0)
    P = torch.randn(6, 3, 2, dtype=torch.float64) * 1.5
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        exact = quadrature_log_prob(P, dec, m=1024)
        elbo = cartesian_elbo(P, uniform_gr(2, 3), dec.log_prob, 4000, generator=gen)
        iwae = cartesian_elbo(P, uniform_gr(2, 3), dec.log_prob, 4000, True, generator=gen)
    assert (exact - elbo > 0.3).all()  # the decoder is far from equivariant: a real gap
    assert (iwae >= elbo).all()
    # the IWAE estimate of a peaked fibre integral is noisy at 4,000 draws (about 0.05)
    assert torch.allclose(iwae, exact, atol=0.2)


def test_latent_orientation_model_normalizes():
    # the exact density of the paper's model (fibre quadrature) integrates to one on R^{3x2}
    dec = decoder(3, 2, seed=3)
    torch.manual_seed(2)
    proposal = torch.distributions.Normal(torch.tensor(0.0).double(), torch.tensor(1.5).double())
    P = proposal.sample((40_000, 3, 2))
    with torch.no_grad():
        w = (quadrature_log_prob(P, dec, m=64) - proposal.log_prob(P).sum((-1, -2))).exp()
    assert abs(w.mean().item() - 1) < mc_tolerance(w)


def test_random_orthogonal_is_orthogonal_and_covers_both_components():
    Q = random_orthogonal((2000,), 3, generator=torch.Generator().manual_seed(0))
    eye = torch.eye(3, dtype=torch.float64)
    assert torch.allclose(Q.mT @ Q, eye.expand_as(Q), atol=1e-12)
    frac = (torch.det(Q) > 0).double().mean().item()
    assert 0.45 < frac < 0.55
    assert torch.allclose(Q.mean(0), torch.zeros(3, 3, dtype=torch.float64), atol=0.06)


def test_gradients_reach_every_parameter():
    dec = GramDecoder(ScaleEstimator(5, 3)).double()  # BatchNorm trunk, train mode
    Y = torch.linalg.qr(torch.randn(8, 5, 3, dtype=torch.float64))[0]
    S = dec.sample(Y).detach()
    dec.log_prob(S, Y).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in dec.parameters())


def test_bad_inputs():
    est = ScaleEstimator(5, 3)
    with pytest.raises(ValueError, match=r"\(\.\.\., 5, 3\)"):
        est(torch.randn(4, 5, 2))
    with pytest.raises(ValueError, match="NaN"):
        est(torch.full((4, 5, 3), float("nan")))
    with pytest.raises(ValueError, match="init_scale"):
        ScaleEstimator(5, 3, init_scale=torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="k < n"):
        ScaleEstimator(3, 3)
    with pytest.raises(ValueError, match=r"S must have shape"):
        GramDecoder(est).log_prob(torch.eye(2).expand(4, 2, 2), torch.randn(4, 5, 3))
    with pytest.raises(ValueError, match="n_samples"):
        cartesian_elbo(torch.randn(5, 3), uniform_gr(3, 5), lambda S, Y: S[..., 0, 0], 0)
