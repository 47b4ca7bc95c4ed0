"""The paper's QM9 scale estimator, its Gram decoder density, and the -ELBO bound."""

import math

import pytest
import torch
from torch.func import jacrev, vmap

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


def cholesky_to_gram(theta, k):
    """``theta: (..., k(k+1)/2)`` = (log diag L, L below the diagonal row by row) -> ``L L^T``.

    Written out of place so that ``torch.func`` can differentiate it under ``vmap``.
    """
    i, j = torch.tril_indices(k, k, offset=-1)
    to_diag = torch.zeros(k * k, k, dtype=theta.dtype)
    to_diag[torch.arange(k) * (k + 1), torch.arange(k)] = 1
    to_off = torch.zeros(k * k, len(i), dtype=theta.dtype)
    to_off[i * k + j, torch.arange(len(i))] = 1
    L = to_diag @ theta[..., :k].exp().unsqueeze(-1) + to_off @ theta[..., k:].unsqueeze(-1)
    L = L.reshape(theta.shape[:-1] + (k, k))
    return L @ L.mT


@pytest.mark.parametrize("k", [2, 3])
def test_gram_decoder_normalizes(k):
    # catches a wrong Jacobian of S = L L^T in GramDecoder.log_prob (the exponents k - i + 2 of
    # L_ii, the 2^k) and a wrong normalizing constant.
    # Importance sampling from a Gaussian in theta = (log diag L, off-diagonal L), centred like
    # the decoder and 1.2 times wider in every coordinate, so the weights are bounded (by
    # 1.2^(k(k+1)/2)); its density on SPD(k) (Lebesgue on the entries i <= j) is
    # N(theta) / |det dS/dtheta|, the determinant from autograd, not from the decoder's
    # formula. (A Wishart proposal has lighter tails than the decoder's log-normal L_ii, so
    # its weights have infinite variance: it gave a tolerance of 0.28 for k = 3.)
    dec = decoder(4, k)
    torch.manual_seed(1)
    Y = torch.linalg.qr(torch.randn(4, k, dtype=torch.float64))[0]
    with torch.no_grad():
        log_s = dec.estimator(Y[None])[0].log()
        loc = torch.cat([log_s, log_s.new_zeros(k * (k - 1) // 2)])
        scale = 1.2 * torch.cat([dec.log_tau.exp(), dec.log_omega.exp()])
    proposal = torch.distributions.Normal(loc, scale)
    theta = proposal.sample((50_000,))
    i, j = torch.triu_indices(k, k)
    jac = vmap(jacrev(lambda t: cholesky_to_gram(t, k)[i, j]))(theta)
    S = cholesky_to_gram(theta, k)
    with torch.no_grad():
        log_w = dec.log_prob(S, Y.expand(len(S), 4, k)) - proposal.log_prob(theta).sum(-1)
    w = (log_w + torch.linalg.slogdet(jac)[1]).exp()
    se = w.std().item() / len(w) ** 0.5
    # the check has power: 4 SE < 0.02, while (measured) the exponent of the last L_ii off by
    # one moves the integral by 0.048 (k = 3) and 0.17 (k = 2), of every L_ii by >= 0.14
    assert se < 0.005
    assert abs(w.mean().item() - 1) < 4 * se


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


@pytest.mark.slow
def test_elbo_below_iwae_below_exact():
    # catches an IWAE that is not log-mean-exp over the Haar draws (a missing - log L, the
    # ELBO's mean of logs, draws over SO(2) only) and a quadrature reference that disagrees
    dec = decoder(3, 2)
    torch.manual_seed(0)
    P = torch.randn(6, 3, 2, dtype=torch.float64) * 0.7
    L = 150_000
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        exact = quadrature_log_prob(P, dec, m=1024)
        elbo = cartesian_elbo(P, uniform_gr(2, 3), dec.log_prob, 4000, generator=gen)
        iwae = cartesian_elbo(P, uniform_gr(2, 3), dec.log_prob, L, True, generator=gen)
        # L single-draw log-weights (one Haar draw per copy of P), for the IWAE's error
        log_w = cartesian_elbo(P.expand(L, 6, 3, 2), uniform_gr(2, 3), dec.log_prob, 1,
                               generator=gen)  # fmt: skip
    assert (exact - elbo > 1.5).all()  # the decoder is far from equivariant: a real gap
    assert (iwae >= elbo).all()
    # log of a mean of L weights: standard error sd(w) / (mean(w) sqrt(L)) (delta method), and
    # a downward bias of about half its square
    w = (log_w - log_w.max(0).values).exp()
    se = w.std(0) / (w.mean(0) * L**0.5)
    # the check has power: 4 SE < 0.04, while (measured) Haar draws over SO(2) only move the
    # IWAE by >= 0.25, its mean of logs (the ELBO) by >= 1.6
    assert (se < 0.01).all()
    assert ((iwae - exact).abs() < 4 * se + se**2).all()


def test_latent_orientation_model_normalizes():
    # catches a wrong constant or det S exponent in cartesian_log_prob_gram, a wrong Gr(2, 3)
    # volume, or a decoder that does not normalize.
    # The paper's model (exact up to the fibre quadrature) integrates to one on R^{3x2}. The
    # proposal, independent Student-t(5) entries of scale 0.6, has polynomial tails, heavier
    # than the model's log-normal scales, so the weights are bounded. m = 128 quadrature
    # nodes: the integral then differs from m = 512 by 4e-4 (measured), m = 64 by 4e-3.
    dec = decoder(3, 2, seed=3)
    torch.manual_seed(2)
    proposal = torch.distributions.StudentT(*torch.tensor([5.0, 0.0, 0.6]).double())
    P = proposal.sample((10_000, 3, 2))
    with torch.no_grad():
        w = (quadrature_log_prob(P, dec, m=128) - proposal.log_prob(P).sum((-1, -2))).exp()
    se = w.std().item() / len(w) ** 0.5
    # the check has power: 4 SE < 0.04, while (measured) one det S^-1/2 too many moves the
    # integral by 0.4
    assert se < 0.01
    assert abs(w.mean().item() - 1) < 4 * se


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
