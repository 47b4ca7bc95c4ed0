"""Tests for the SPD log-normal (grassflow.distributions.spd), the metric fit and DistanceGram.

References: torch's LogNormal (k = 1), importance sampling from a Wishart (normalization),
torch.linalg.lstsq (the metric fit), the sampler's closed-form moments of log eigenvalues,
and group actions applied by hand (equivariance, relabelling).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions.cartesian import wishart_log_prob, wishart_sample
from grassflow.distributions.spd import (
    spd_lognormal_log_prob,
    spd_lognormal_precision_log_prob,
    spd_lognormal_precision_sample,
    spd_lognormal_sample,
    sym_coords,
)
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn import scale_init_
from grassflow_paper.gram_densities import DistanceGram, metric_fit

M3 = torch.tensor([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.7]], dtype=torch.float64)


def _t(x: float, m: int = 1) -> torch.Tensor:
    return torch.full((m,), x, dtype=torch.float64)


def _log_eigs(S: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
    L = torch.linalg.cholesky(M)
    A = torch.linalg.solve_triangular(L, torch.linalg.solve_triangular(L, S, upper=False).mT,
                                      upper=False)  # fmt: skip
    return torch.linalg.eigvalsh((A + A.mT) / 2).log()


def test_spd_lognormal_is_the_scalar_lognormal_for_k1():
    # catches: a wrong normalizing constant or Jacobian (the k = 1 case has only the trace
    # direction: S = M exp(E), E ~ N(0, sigma_t^2))
    S = torch.tensor([0.3, 1.0, 2.5, 7.0], dtype=torch.float64)[:, None, None]
    M = torch.full_like(S, 1.7)
    got = spd_lognormal_log_prob(S, M, _t(0.9, 4), _t(0.4, 4))
    ref = torch.distributions.LogNormal(math.log(1.7), 0.4).log_prob(S[:, 0, 0])
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("k", [2, 3])
def test_spd_lognormal_normalizes(k):
    # catches: a wrong 2^(k(k-1)/4) Frobenius factor, a wrong dexp Jacobian or the congruence
    # factor det(M)^((k+1)/2) missing: E_{S ~ Wishart}[p(S) / q(S)] = 1
    torch.manual_seed(0)
    m, M = 60000, M3[:k, :k]
    nu = torch.tensor(12.0, dtype=torch.float64)
    V = (M / 12).expand(m, k, k)
    S = wishart_sample(nu.expand(m), V, torch.Generator().manual_seed(1))
    w = torch.exp(spd_lognormal_log_prob(S, M.expand(m, k, k), _t(0.35, m), _t(0.25, m))
                  - wishart_log_prob(S, nu, V))  # fmt: skip
    tol = mc_tolerance(w)
    assert tol / 4 <= 0.01 and w.std() > 0.1  # power, and q is not p
    assert abs(w.mean().item() - 1.0) < tol


def test_spd_lognormal_is_equivariant_and_independent_of_the_square_root():
    # catches: a density that depends on the Cholesky factor (not O(k)-invariant E), or on S
    # and M through something other than M^-1 S
    torch.manual_seed(1)
    S = wishart_sample(_t(9.0, 5), (M3 / 9).expand(5, 3, 3), torch.Generator().manual_seed(2))
    ref = spd_lognormal_log_prob(S, M3.expand(5, 3, 3), _t(0.3, 5), _t(0.2, 5))
    for reflect in (False, True):
        Q = random_orthogonal(3, reflect).double()
        got = spd_lognormal_log_prob(Q.mT @ S @ Q, (Q.mT @ M3 @ Q).expand(5, 3, 3),
                                     _t(0.3, 5), _t(0.2, 5))  # fmt: skip
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)
    # a near-degenerate spectrum (a round cloud) keeps finite gradients
    Sd = (torch.eye(3, dtype=torch.float64) * 2 + 1e-9 * M3).requires_grad_()
    spd_lognormal_log_prob(Sd, 2 * torch.eye(3, dtype=torch.float64), _t(0.3)[0],
                           _t(0.2)[0]).backward()  # fmt: skip
    assert torch.isfinite(Sd.grad).all()


def test_spd_lognormal_sample_matches_its_law():
    # catches: a sampler with the trace and traceless widths swapped, off-diagonal variance
    # not halved, or centred elsewhere than M
    m, k = 40000, 3
    S = spd_lognormal_sample(M3.expand(m, k, k), _t(0.3, m), _t(0.15, m),
                             torch.Generator().manual_seed(3))  # fmt: skip
    lam = _log_eigs(S, M3)
    tr = lam.sum(-1)
    free = (lam * lam).sum(-1) - tr * tr / k
    for x, mean in ((tr, 0.0), (tr * tr, k * 0.15**2), (free, 5 * 0.3**2)):
        assert abs(x.mean().item() - mean) < mc_tolerance(x)


def test_metric_fit_is_least_squares_and_exact_on_consistent_targets():
    # catches: off-diagonal entries counted once instead of twice, or weights applied twice
    torch.manual_seed(4)
    d = torch.randn(2, 15, 3, dtype=torch.float64)
    w = torch.rand(2, 15, dtype=torch.float64) + 0.1
    S_true = M3.expand(2, 3, 3)
    t = torch.einsum("npa,nab,npb->np", d, S_true, d)
    torch.testing.assert_close(metric_fit(d, w, t), S_true, atol=1e-8, rtol=0)
    t = t + torch.randn_like(t)
    a, b = torch.triu_indices(3, 3)
    phi = d[..., a] * d[..., b] * torch.where(a == b, 1.0, 2.0).double()
    for i in range(2):
        sw = w[i].sqrt()[:, None]
        s = torch.linalg.lstsq(sw * phi[i], sw[:, 0] * t[i]).solution
        torch.testing.assert_close(metric_fit(d, w, t)[i][a, b], s, atol=1e-6, rtol=0)


def _gram(n, k, components):
    torch.manual_seed(5)
    g = DistanceGram(n, k, hidden=16, layers=1, components=components).double()
    scale_init_(g, 0.5)
    for p in (*g.pair[-1].parameters(), *g.spread.parameters()):
        torch.nn.init.normal_(p, std=0.2)
    with torch.no_grad():
        g.spread.bias[: 2 * components] += math.log(0.3)
    return g


def _trace_sd(precision: torch.Tensor, k: int) -> torch.Tensor:
    """Standard deviation of tr E = log det(L^-1 S L^-T) under E's precision."""
    u = sym_coords(torch.eye(k, dtype=torch.float64))
    v = torch.linalg.solve(precision, u.expand(*precision.shape[:-1]))
    return (v @ u).sqrt()


@pytest.mark.parametrize("n,k", [(5, 2), (6, 3)])
def test_distance_gram_is_equivariant_and_permutation_invariant(n, k):
    # catches: pair vectors taken from Y instead of the points H Y, pair features that are not
    # invariant (so S* does not rotate with the basis), a precision built from L that is not
    # invariant under L -> L R, or targets that do not follow their pair
    g = _gram(n, k, 2)
    Y = Grassmann(k, n - 1).random(4)
    S = wishart_sample(_t(8.0, 4), torch.eye(k, dtype=torch.float64).expand(4, k, k) / 8)
    H = g.graph.H.double()
    with torch.no_grad():
        L, precision, log_pi = g.mixture_params(Y)
        M = L @ L.mT
        ref = g.log_prob(S, Y)
        assert M.std(0).max() > 1e-3 and precision.std(0).max() > 1e-3  # depends on Y
        for reflect in (False, True):
            Q = random_orthogonal(k, reflect).double()
            Lq, Pq, _ = g.mixture_params(Y @ Q)
            torch.testing.assert_close(Lq @ Lq.mT, Q.mT @ M @ Q, atol=1e-7, rtol=0)
            # (the precision's coordinates depend on the factor, its spectrum does not)
            torch.testing.assert_close(torch.linalg.eigvalsh(Pq), torch.linalg.eigvalsh(
                precision), atol=1e-6, rtol=1e-9)  # fmt: skip
            torch.testing.assert_close(g.log_prob(Q.mT @ S @ Q, Y @ Q), ref, atol=1e-7, rtol=0)
        perm = torch.randperm(n)
        U = H.mT @ torch.eye(n, dtype=torch.float64)[perm] @ H
        torch.testing.assert_close(g.log_prob(S, U @ Y), ref, atol=1e-7, rtol=0)


def _pair_differences(Y: torch.Tensor, n: int) -> torch.Tensor:
    """``y~_i - y~_j`` for i < j (row-major), the points ``H Y`` of the span's frame."""
    Yt = helmert_basis(n) @ Y
    return torch.stack([Yt[..., i, :] - Yt[..., j, :] for i in range(n) for j in range(i + 1, n)],
                       -2)  # fmt: skip


def _weighted_lstsq(d: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The S minimizing ``sum_p w_p (d_p^T S d_p - t_p)^2`` for one ``d: (P, k)``: the
    minimum-norm torch.linalg.lstsq solution over all k^2 entries, symmetric because every
    row ``vec(d d^T)`` is."""
    k = d.shape[-1]
    rows = (d[:, :, None] * d[:, None, :]).reshape(len(d), k * k) * w.sqrt()[:, None]
    S = torch.linalg.lstsq(rows, t * w.sqrt(), driver="gelsd").solution.reshape(k, k)
    torch.testing.assert_close(S, S.mT, atol=1e-10, rtol=0)
    return S


def test_distance_gram_centre_is_the_weighted_fit_of_its_pair_targets():
    # catches: metric_fit given the targets as weights and the weights as targets (the
    # DistanceGram centre): S*(Y) must be the least-squares metric of the pair network's own
    # outputs, weights (first of each component's triple) and targets (second), recomputed
    # here by lstsq from pair differences built from the Helmert basis
    n, k = 6, 3
    g = _gram(n, k, 2)
    Y = Grassmann(k, n - 1).random(5)
    seen = []
    hook = g.pair.register_forward_hook(lambda mod, args, out: seen.append(out))
    with torch.no_grad():
        L = g.mixture_params(Y)[0]  # (5, 2, k, k)
    hook.remove()
    out = seen[0].unflatten(-1, (2, 3)).exp()  # (5, P, C, 3): weight, target, precision
    w, t = out[..., 0], out[..., 1]
    assert w.std() > 0.05 and t.std() > 0.05 and (w - t).abs().min() > 1e-3  # they differ
    d = _pair_differences(Y, n)
    for b in range(5):
        for c in range(2):
            ref = _weighted_lstsq(d[b], w[b, :, c], t[b, :, c])
            assert torch.linalg.eigvalsh(ref)[0] > 10 * g.floor  # no eigenvalue lift
            torch.testing.assert_close(L[b, c] @ L[b, c].mT, ref, atol=1e-8, rtol=1e-8)


def test_initialize_targets_the_clouds_mean_squared_pair_distance():
    # catches: DistanceGram.initialize taking its targets from |d|^2 in the span's frame
    # (ignoring S), and metric_fit given the targets as weights and the weights as targets.
    # On a fresh module every pair has weight 1 and, after initialize, the target t = the
    # clouds' mean squared pair distance (torch.pdist of the clouds X = H Y B, S = B B^T),
    # so its centre is the lstsq fit of d^T S d = t. The clouds' extent is far from 1 and
    # anisotropic, so neither |d|^2 nor swapped roles give it.
    n, k, N = 6, 3, 40
    torch.manual_seed(12)
    g = DistanceGram(n, k, hidden=16).double()
    Y = Grassmann(k, n - 1).random(N)
    M = 9.0 * M3
    S = wishart_sample(_t(12.0, N), (M / 12).expand(N, k, k), torch.Generator().manual_seed(13))
    X = helmert_basis(n) @ Y @ torch.linalg.cholesky(S)  # rows x_i with x_i x_j^T = y~_i S y~_j
    sq = torch.stack([torch.pdist(x) ** 2 for x in X])  # (N, P)
    d = _pair_differences(Y, n)
    torch.testing.assert_close(torch.einsum("npa,nab,npb->np", d, S, d), sq)  # the frame
    g.initialize(S, Y)
    assert g.scale.item() == pytest.approx(torch.diagonal(S, 0, -2, -1).mean().item())
    t = sq.mean()
    assert abs(t - 1.0) > 5.0 and abs((d * d).sum(-1).mean() / t - 1.0) > 0.5
    with torch.no_grad():
        L = g.mixture_params(Y[:6])[0][:, 0]
    for b in range(6):
        ref = _weighted_lstsq(d[b], torch.ones(len(d[b])), t.expand(len(d[b])))
        assert torch.linalg.eigvalsh(ref)[0] > 10 * g.floor * g.scale
        torch.testing.assert_close(L[b] @ L[b].mT, ref, atol=1e-7, rtol=1e-8)


def test_distance_gram_normalizes():
    # catches: mixture weights, pair precisions or component densities that do not integrate
    # to one (the Cartesian density would not), to 3 %: importance sampling from isotropic
    # log-normals around the components' centres, as wide as each component in its widest
    # direction, so that the weights are bounded (by the mixture's ratio of determinants)
    n, k, m = 6, 3, 60000
    g = _gram(n, k, 2)
    with torch.no_grad():
        g.pair[-1].bias[2::3] = 2.0  # pair precisions that matter
    Y = Grassmann(k, n - 1).random(1)
    with torch.no_grad():
        L, precision, log_pi = (x[0] for x in g.mixture_params(Y))
        M = L @ L.mT
        ev = torch.linalg.eigvalsh(precision)
        assert (ev[:, -1] > 2 * ev[:, 0]).all()  # anisotropic
        width = 1.0 / ev[:, 0].sqrt()  # (C,): p_c / q_c <= 1 at every E (|E|^2 / w^2 <= E P E)
        comp = torch.multinomial(log_pi.exp(), m, replacement=True)
        S = spd_lognormal_sample(M[comp], width[comp], width[comp],
                                 torch.Generator().manual_seed(6))  # fmt: skip
        log_q = torch.logsumexp(torch.stack([
            log_pi[c] + spd_lognormal_log_prob(S, M[c].expand(m, k, k), width[c].expand(m),
                                               width[c].expand(m)) for c in range(2)
        ]), 0)  # fmt: skip
        w = torch.exp(g.log_prob(S, Y.expand(m, -1, -1)) - log_q)
    tol = mc_tolerance(w)
    assert tol + 2.5 * tol / 4 < 0.03 and w.std() > 0.1  # power: 3 % is > tol + 2.5 se off
    assert abs(w.mean().item() - 1.0) < tol


def test_distance_gram_sample_picks_components_with_their_weights():
    # catches: a sampler that picks components by another law than log_prob's weights, pairs
    # a component's centre with another's precision, or draws E with the covariance P instead
    # of P^-1: log det S | c ~ N(log det M_c, var(tr E)), a closed-form mixture CDF
    n, k, m = 6, 3, 20000
    g = _gram(n, k, 2)
    with torch.no_grad():
        g.pair[-1].bias[2::3] = 3.0
    Y = Grassmann(k, n - 1).random(1)
    with torch.no_grad():
        L, precision, log_pi = (x[0] for x in g.mixture_params(Y))
        S = g.sample(Y.expand(m, -1, -1), torch.Generator().manual_seed(7))
    x = torch.logdet(S).sort().values
    mu, sd = 2 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1), _trace_sd(precision, k)
    assert (mu[0] - mu[1]).abs() > 0.3 * sd.max()  # the components are distinguishable
    cdf = (log_pi.exp() * torch.distributions.Normal(mu, sd).cdf(x[:, None])).sum(-1)
    ks = (cdf - torch.arange(1, m + 1, dtype=torch.float64) / m).abs().max()
    assert ks < 1.63 / math.sqrt(m)  # the 1 % critical value of Kolmogorov-Smirnov


def test_precision_form_reduces_to_the_isotropic_one_and_has_stable_gradients():
    # catches: a wrong Frobenius scaling of sym_coords or of the sampler's off-diagonals (the
    # two parameterizations of one law would disagree), and NaN/inf gradients of log A at
    # equal eigenvalues (a well-fitted S has A = L^-1 S L^-T near I)
    from grassflow.distributions.spd import spd_log

    k, m = 3, 6
    L = torch.linalg.cholesky(M3)
    S = spd_lognormal_sample(M3.expand(5, k, k), _t(0.5, 5), _t(0.5, 5),
                             torch.Generator().manual_seed(8))  # fmt: skip
    u = sym_coords(torch.eye(k, dtype=torch.float64)) / math.sqrt(k)
    P = torch.eye(m, dtype=torch.float64) / 0.3**2 + (1 / 0.2**2 - 1 / 0.3**2) * torch.outer(u, u)
    torch.testing.assert_close(
        spd_lognormal_precision_log_prob(S, L.expand(5, k, k), P.expand(5, m, m)),
        spd_lognormal_log_prob(S, M3.expand(5, k, k), _t(0.3, 5), _t(0.2, 5)),
        atol=1e-9, rtol=1e-12)  # fmt: skip
    X = spd_lognormal_precision_sample(L.expand(40000, k, k), P.expand(40000, m, m),
                                       torch.Generator().manual_seed(9))  # fmt: skip
    lam = _log_eigs(X, M3)
    tr, free = lam.sum(-1), (lam * lam).sum(-1) - lam.sum(-1) ** 2 / k
    for x, mean in ((tr * tr, k * 0.2**2), (free, 5 * 0.3**2)):
        assert abs(x.mean().item() - mean) < mc_tolerance(x)
    A = (torch.eye(k, dtype=torch.float64) + 1e-3 * M3).requires_grad_()
    assert torch.autograd.gradcheck(lambda A: spd_log(A), (A,))
    eq = torch.eye(k, dtype=torch.float64).requires_grad_()
    (spd_log(eq) * M3).sum().backward()
    torch.testing.assert_close(eq.grad, M3, atol=1e-12, rtol=0)  # d log at I is the identity


def test_shape_flow_with_the_distance_gram_is_invariant_and_samples():
    # catches: the option not reaching TwoPartShapeFlow (a Wishart instead), the span-dependent
    # initialization not run by train_shape_flow, or a Cartesian density that is not invariant
    # to translations, rotations, reflections and relabelling with this Gram density
    from grassflow_paper.two_part import TwoPartShapeFlow

    n, d = 6, 3
    torch.manual_seed(10)
    model = TwoPartShapeFlow(n, d, gram="distance", gram_options={"hidden": 16}).double()
    assert isinstance(model.gram, DistanceGram)
    P = 2.0 * torch.randn(40, n, d, dtype=torch.float64)
    Y, S = model.factor(P)
    model.gram.initialize(S, Y)
    assert model.gram.scale.item() == pytest.approx(torch.diagonal(S, 0, -2, -1).mean().item())
    with torch.no_grad():
        lp = model.log_prob(P[:6], exact=True)
        assert torch.isfinite(lp).all() and lp.std() > 0.1
        Q = random_orthogonal(d, reflect=True).double()
        moved = P[:6, torch.randperm(n)] @ Q + torch.randn(6, 1, d, dtype=torch.float64)
        torch.testing.assert_close(model.log_prob(moved, exact=True), lp, atol=1e-6, rtol=0)
        X = model.sample(5, torch.Generator().manual_seed(11))
    assert X.shape == (5, n, d) and torch.isfinite(X).all()
    with pytest.raises(ValueError, match="gram must be one of"):
        TwoPartShapeFlow(n, d, gram="gaussian")
