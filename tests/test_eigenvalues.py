import math

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from conftest import mc_tolerance
from grassflow.distributions.cartesian import cartesian_log_prob
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import shape_factor
from grassflow.nn.eigenvalues import (
    EigenvalueDensity,
    eigenvalues_to_log_gaps,
    log_gaps_to_eigenvalues,
)


def make_model(n, k, hidden=(32, 32), norm="batch", gain=1000.0, **kw):
    """An eval-mode model whose density visibly depends on Y, with generic head biases."""
    model = EigenvalueDensity(n, k, hidden=hidden, norm=norm, **kw)
    with torch.no_grad():
        # undo most of the 1e-2 head init so that mean, scale and correlation vary with Y
        model.head.weight.mul_(gain)
        if "init_mean" not in kw:
            model.head.bias[:k] += 0.3 * torch.randn(k)
            model.head.bias[k : 2 * k] = math.log(0.5) + 0.2 * torch.randn(k)
            model.head.bias[2 * k :] = 0.4 * torch.randn(k * (k - 1) // 2)
    return model.eval()


def sorted_lognormal(N, k, m, s):
    """Proposal on the chamber: sorted i.i.d. LogNormal(m, s^2), with its exact log-density.

    q(lam) = k! prod_i LN(lam_i; m, s): sorting folds the k! orderings onto the chamber.
    """
    lam = torch.exp(m + s * torch.randn(N, k)).sort(-1, descending=True).values
    x = (lam.log() - m) / s
    log_ln = -0.5 * x.square() - lam.log() - math.log(s) - 0.5 * math.log(2 * math.pi)
    return lam, log_ln.sum(-1) + math.lgamma(k + 1)


def uniform_gr(k, n):
    return lambda Y: Y.new_full(Y.shape[:-2], -Grassmann(k, n).log_volume())


def canonical_Y(n, k, batch=()):
    return shape_factor(torch.randn(*batch, n, k))[0]


# ------------------------------------------------------------------ the chamber <-> R^k map
def test_log_gap_map_round_trip_and_jacobian():
    lam = torch.tensor([5.0, 2.5, 0.7])
    z, log_det = eigenvalues_to_log_gaps(lam)
    expected = torch.log(torch.tensor([0.7, 2.5 - 0.7, 5.0 - 2.5]))
    assert torch.allclose(z, expected, atol=1e-14)
    assert torch.allclose(log_gaps_to_eigenvalues(z), lam, atol=1e-14)
    J = torch.autograd.functional.jacobian(lambda x: eigenvalues_to_log_gaps(x)[0], lam)
    assert log_det.item() == pytest.approx(torch.linalg.slogdet(J)[1].item(), abs=1e-12)
    # every z is a point of the chamber
    lam2 = log_gaps_to_eigenvalues(3 * torch.randn(1000, 4))
    assert (lam2 > 0).all() and (lam2[:, :-1] > lam2[:, 1:]).all()


# ------------------------------------------------------------------ normalization
def test_normalization_quadrature_k1():
    model = make_model(4, 1)
    Y = canonical_Y(4, 1)
    t = torch.linspace(-12, 12, 200_001)  # t = log lam, dlam = lam dt
    with torch.no_grad():
        dens = torch.exp(model.log_prob(t.exp()[:, None], Y) + t)
    assert torch.trapezoid(dens, t).item() == pytest.approx(1.0, abs=1e-8)


@pytest.mark.parametrize("n,k,hidden", [(4, 2, (32, 32)), (5, 3, (32, 32)),
                                        (19, 3, (128, 256, 256, 128))])  # fmt: skip
def test_normalization_importance_sampling(n, k, hidden):
    model = make_model(n, k, hidden, gain=100.0)
    Y = canonical_Y(n, k)
    lam, log_q = sorted_lognormal(400_000, k, 0.3, 1.2)
    with torch.no_grad():
        w = torch.exp(model.log_prob(lam, Y) - log_q)  # Y broadcasts against the samples
    assert mc_tolerance(w) < 0.03  # the check has teeth
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))


def test_cartesian_density_normalizes():
    # exact density on R^{3x2}: uniform Gr(2, 3), lam | Y from the model, Haar orientations
    n, k, N, s = 3, 2, 200_000, 1.2
    model = make_model(n, k, gain=300.0, init_mean=torch.log(torch.tensor([3.0, 1.0])),
                       init_std=0.5)  # fmt: skip
    P = s * torch.randn(N, n, k)
    with torch.no_grad():
        # the law of lam really depends on Y
        assert model.log_prob(torch.tensor([3.0, 1.0]), shape_factor(P[:2000])[0]).std() > 0.05
        log_p = cartesian_log_prob(P, uniform_gr(k, n), model)
    log_q = -0.5 * n * k * math.log(2 * math.pi * s**2) - P.square().sum((-2, -1)) / (2 * s**2)
    w = torch.exp(log_p - log_q)
    assert mc_tolerance(w) < 0.05
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))


# ------------------------------------------------------------------ sampling vs log_prob
def test_sampling_matches_log_prob_k1_ks():
    model = make_model(4, 1)
    Y = canonical_Y(4, 1)
    t = torch.linspace(-12, 12, 200_001)
    with torch.no_grad():
        dens = torch.exp(model.log_prob(t.exp()[:, None], Y) + t)
        cdf = torch.cumulative_trapezoid(dens, t)
        x = model.sample(Y.expand(20_000, 4, 1))[:, 0]
    cdf = np.concatenate([[0.0], cdf.numpy()])
    grid = t.exp().numpy()
    assert kstest(x.numpy(), lambda v: np.interp(v, grid, cdf)).pvalue > 1e-3


@pytest.mark.parametrize("k", [2, 3])
def test_sample_moments_match_importance_weighted_log_prob(k):
    n, N = 5, 200_000
    model = make_model(n, k, gain=100.0)
    Y = canonical_Y(n, k)
    lam_q, log_q = sorted_lognormal(N, k, 0.3, 1.2)
    with torch.no_grad():
        w = torch.exp(model.log_prob(lam_q, Y) - log_q)
        lam_p = model.sample(Y.expand(N, n, k))
    # E[log lam_i] (and for the full Cholesky factor, the covariance of log lam_1, log lam_k)
    for f in (lambda lam: lam.log(), lambda lam: lam[:, :1].log() * lam[:, -1:].log()):
        a, b = f(lam_p), w[:, None] * f(lam_q)
        for i in range(a.shape[1]):
            tol = 4 * math.sqrt(a[:, i].var() / N + b[:, i].var() / N)
            assert a[:, i].mean().item() == pytest.approx(b[:, i].mean().item(), abs=tol)


def test_samples_descending_positive_and_reproducible():
    model = make_model(6, 3)
    Y = canonical_Y(6, 3, (4, 5))
    lam = model.sample(Y, generator=torch.Generator().manual_seed(1))
    assert lam.shape == (4, 5, 3)
    assert (lam > 0).all() and (lam[..., :-1] > lam[..., 1:]).all()
    again = model.sample(Y, generator=torch.Generator().manual_seed(1))
    assert torch.equal(lam, again)
    assert torch.isfinite(model.log_prob(lam, Y)).all()


def test_init_mean_centres_the_initial_density():
    init = torch.log(torch.tensor([62.0, 28.0, 14.6]))  # QM9 19-atom medians (Å^2)
    model = EigenvalueDensity(19, 3, init_mean=init, init_std=1e-3).eval()
    lam = model.sample(canonical_Y(19, 3, (64,)))
    assert torch.allclose(lam, init.exp().expand_as(lam), rtol=0.02)


# ------------------------------------------------------------------ training behaviour
@pytest.mark.parametrize("norm", ["batch", "layer", None])
def test_gradients_reach_every_parameter(norm):
    model = EigenvalueDensity(5, 3, hidden=(16, 16), norm=norm).train()
    Y, lam, _ = shape_factor(torch.randn(32, 5, 3))
    loss = -model.log_prob(lam, Y).mean() + model.sample(Y).sum()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_batchnorm_train_vs_eval():
    model = EigenvalueDensity(5, 3, hidden=(16, 16), norm="batch")
    Y, lam, _ = shape_factor(torch.randn(16, 5, 3))
    # train mode: batch statistics, so a molecule's value depends on its batch-mates
    model.train()
    full, part = model.log_prob(lam, Y), model.log_prob(lam[:8], Y[:8])
    assert not torch.allclose(full[:8], part)
    assert model.trunk[1].num_batches_tracked.item() == 2
    # eval mode: a deterministic density of each (lam, Y) on its own
    model.eval()
    with torch.no_grad():
        full = model.log_prob(lam, Y)
        single = torch.stack([model.log_prob(lam[i], Y[i]) for i in range(16)])
        assert torch.allclose(full, single, rtol=0, atol=1e-12)
        assert torch.equal(full, model.log_prob(lam, Y))
        assert torch.equal(model(lam, Y), full)


def test_ties_give_minus_inf_with_finite_gradients():
    model = make_model(5, 3)
    Y = canonical_Y(5, 3)
    lam = torch.tensor([[3.0, 2.0, 2.0], [3.0, 2.0, 1.0]])
    lp = model.log_prob(lam, Y)
    assert lp[0].item() == -math.inf and torch.isfinite(lp[1])
    lp[1].backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# ------------------------------------------------------------------ errors
def test_bad_inputs():
    model = EigenvalueDensity(5, 2, hidden=(8,)).eval()
    Y = canonical_Y(5, 2, (4,))
    with pytest.raises(ValueError, match="descending"):
        model.log_prob(torch.tensor([[1.0, 2.0]]).expand(4, 2), Y)
    with pytest.raises(ValueError, match="positive"):
        model.log_prob(torch.tensor([2.0, 0.0]), Y)
    with pytest.raises(ValueError, match="NaN"):
        model.log_prob(torch.tensor([math.nan, 1.0]), Y)
    with pytest.raises(ValueError, match="floating"):
        model.log_prob(torch.tensor([2, 1]), Y)
    with pytest.raises(ValueError, match=r"\(\.\.\., 2\)"):
        model.log_prob(torch.tensor([3.0, 2.0, 1.0]), Y)
    with pytest.raises(ValueError, match=r"\(\.\.\., 5, 2\)"):
        model.log_prob(torch.tensor([2.0, 1.0]), canonical_Y(6, 2))
    with pytest.raises(ValueError, match="broadcast"):
        model.log_prob(torch.tensor([[2.0, 1.0]]).expand(3, 2), Y)
    with pytest.raises(ValueError, match=r"\(\.\.\., 5, 2\)"):
        model.sample(torch.randn(5))
    with pytest.raises(ValueError, match="1 <= k < n"):
        EigenvalueDensity(3, 3)
    with pytest.raises(ValueError, match="integer"):
        EigenvalueDensity(5.0, 2)
    with pytest.raises(ValueError, match="norm"):
        EigenvalueDensity(5, 2, norm="group")
    with pytest.raises(ValueError, match="hidden"):
        EigenvalueDensity(5, 2, hidden=(8, 0))
    with pytest.raises(ValueError, match="init_std"):
        EigenvalueDensity(5, 2, init_std=0.0)
    with pytest.raises(ValueError, match="shape"):
        EigenvalueDensity(5, 2, init_mean=torch.zeros(3))
    with pytest.raises(ValueError, match="descending"):
        EigenvalueDensity(5, 2, init_mean=torch.tensor([0.0, 1.0]))
