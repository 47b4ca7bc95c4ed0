"""Tests for the point-cloud networks: GraphPotential / PointGraph (invariances, time
conditioning, labels), GrassmannField on it (horizontality, equivariances, Laplace-Beltrami
divergence), the Wishart helpers of grassflow.distributions.cartesian and WishartGram.

A permutation sigma of the n points acts on a cloud by ``P -> Pi P`` with ``(Pi P)_i =
P_sigma(i)``, and on its Helmert coordinates / representatives by ``Y -> U Y`` with
``U = H^T Pi H`` (orthogonal, since Pi fixes the all-ones vector). The networks are untrained but
made non-trivial with ``scale_init_`` (and, for WishartGram, random weight and dof heads, which
start at zero). References: torch.distributions.Wishart, the generic torch.func divergence,
Wishart moments (Muirhead Thm 3.2.4 and 3.3.x), and explicit loops over the batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions.cartesian import wishart_log_prob, wishart_sample
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn import GraphPotential, GrassmannField, PointGraph, scale_init_
from grassflow.ode import divergence_exact
from grassflow_paper.gram_densities import WishartGram

CASES = [(5, 2), (6, 3)]  # (n points, k): Gr(2, 4) and Gr(3, 5)


def perm_action(perm: list[int]) -> torch.Tensor:
    """``U = H^T Pi H``, the action of relabelling the points on Helmert coordinates."""
    n = len(perm)
    H = helmert_basis(n)
    Pi = torch.eye(n)[perm]
    return H.mT @ Pi @ H


def random_perm(n: int) -> list[int]:
    """A random permutation that moves every point (so it is never the identity)."""
    while True:
        perm = torch.randperm(n).tolist()
        if all(p != i for i, p in enumerate(perm)):
            return perm


def make_potential(n: int, k: int, labels=None, gain: float = 2.0) -> GraphPotential:
    return scale_init_(GraphPotential(n, k, hidden=16, layers=2, labels=labels), gain)


def make_gram(n: int, k: int, spread: float = 0.3, dof: float = 8.0) -> WishartGram:
    """A WishartGram whose weights w_i(Y) and dof nu(Y) really depend on Y (their heads start at
    zero): random heads, scaled so that log w_i and log(nu - k + 1) have standard deviation
    ``spread`` over uniform Y and centred at log w = 0 and nu = dof."""
    gram = WishartGram(n, k, hidden=16, layers=1, dof=dof)
    scale_init_(gram.graph, 2.0)
    with torch.no_grad():
        h = gram.graph(torch.tensor(0.0), Grassmann(k, n - 1).random(200))
        for head, x, centre in [
            (gram.weight, h, 0.0),
            (gram.log_dof, h.mean(-2), math.log(dof - k + 1)),
        ]:
            head.weight.normal_()
            a = head(x) - head.bias
            head.weight.mul_(spread / a.std())
            head.bias.fill_(centre - spread * (a.mean() / a.std()).item())
    return gram


def random_spd(k: int, *batch: int) -> torch.Tensor:
    A = torch.randn(*batch, k, k)
    return A @ A.mT + 0.5 * torch.eye(k)


# ------------------------------------------------------------------ GraphPotential
@pytest.mark.parametrize("n,k", CASES)
def test_potential_is_invariant_under_ok_and_permutations(n, k):
    # catches: features read Y~ itself rather than its Gram matrix (not O(k)-invariant), or an
    # aggregation / Helmert map that does not commute with relabelling
    v = make_potential(n, k)
    Y = Grassmann(k, n - 1).random(6)
    for t in (torch.tensor(0.3), torch.linspace(0.0, 1.0, 6)):
        with torch.no_grad():
            ref = v(t, Y)
            assert ref.shape == (6,)
            for reflect in (False, True):
                torch.testing.assert_close(v(t, Y @ random_orthogonal(k, reflect)), ref,
                                           atol=1e-12, rtol=0)  # fmt: skip
            Qs = torch.linalg.qr(torch.randn(6, k, k))[0]  # one Q per cloud, mixed determinants
            torch.testing.assert_close(v(t, Y @ Qs), ref, atol=1e-12, rtol=0)
            for _ in range(3):
                U = perm_action(random_perm(n))
                torch.testing.assert_close(v(t, U @ Y), ref, atol=1e-12, rtol=0)
        assert ref.std() > 1e-2  # not a constant of Y


@pytest.mark.parametrize("n,k", CASES)
def test_potential_time_conditioning(n, k):
    # catches: per-sample times broadcast along the wrong axis (points instead of clouds), or
    # the time input being dropped
    v = make_potential(n, k)
    Y = Grassmann(k, n - 1).random(5)
    t = torch.tensor([0.0, 0.2, 0.5, 0.7, 1.0])
    with torch.no_grad():
        batched = v(t, Y)
        loop = torch.stack([v(t[i], Y[i]) for i in range(5)])
        torch.testing.assert_close(batched, loop, atol=1e-13, rtol=0)
        # extra batch dims (2, 5): times (2, 5) and a Python float
        Y2 = torch.stack([Y, Y.flip(0)])
        t2 = torch.stack([t, t.flip(0)])
        torch.testing.assert_close(v(t2, Y2), torch.stack([batched, batched.flip(0)]),
                                   atol=1e-13, rtol=0)  # fmt: skip
        torch.testing.assert_close(v(0.5, Y), v(torch.tensor(0.5), Y), atol=0, rtol=0)
        assert (v(torch.tensor(0.0), Y) - v(torch.tensor(1.0), Y)).abs().max() > 1e-2


def test_point_graph_features_permute_with_the_points():
    # catches: node features that are not equivariant (e.g. indexing points by position)
    n, k = 6, 2
    graph = scale_init_(PointGraph(n, k, hidden=8, layers=2), 2.0)
    Y = Grassmann(k, n - 1).random(3)
    perm = random_perm(n)
    with torch.no_grad():
        h = graph(torch.tensor(0.4), Y)
        torch.testing.assert_close(graph(torch.tensor(0.4), perm_action(perm) @ Y), h[:, perm],
                                   atol=1e-12, rtol=0)  # fmt: skip
        # the points seen by the network are the cloud's rows: Y~ = H Y, with sum_i |y~_i|^2 = k
        Yt = graph.points(Y)
        torch.testing.assert_close(Yt, helmert_basis(n) @ Y, atol=1e-15, rtol=0)
        torch.testing.assert_close(Yt.square().sum((-2, -1)), torch.full((3,), float(k)))


def test_graph_rejects_bad_arguments():
    # catches: silently building a network for a degenerate Grassmannian or malformed labels
    for n, k in [(3, 2), (4, 3), (4, 0)]:
        with pytest.raises(ValueError):
            GraphPotential(n, k)
    for labels in ([0, 1, 2], [0.0, 1.0, 0.0, 1.0], [0, -1, 0, 1]):
        with pytest.raises(ValueError):
            GraphPotential(4, 2, labels=torch.tensor(labels))
    with pytest.raises(ValueError):
        GraphPotential(4, 2, hidden=0)


# ------------------------------------------------------------------ labels
def test_labels_restrict_invariance_to_label_preserving_permutations():
    # catches: labels that are ignored (full symmetric invariance) or attached to positions in
    # a way that breaks the label-preserving symmetry
    n, k = 6, 2
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    v = make_potential(n, k, labels=labels)
    Y = Grassmann(k, n - 1).random(8)
    t = torch.tensor(0.6)
    with torch.no_grad():
        ref = v(t, Y)
        for perm in ([1, 0, 2, 3, 4, 5], [0, 1, 3, 4, 2, 5], [1, 0, 4, 2, 3, 5]):
            assert all(labels[p] == labels[i] for i, p in enumerate(perm))
            torch.testing.assert_close(v(t, perm_action(perm) @ Y), ref, atol=1e-12, rtol=0)
        for perm in ([2, 1, 0, 3, 4, 5], [0, 1, 2, 3, 5, 4]):  # swap a 0 with a 1; a 1 with a 2
            assert (v(t, perm_action(perm) @ Y) - ref).abs().max() > 1e-3
        # still O(k)-invariant with labels
        torch.testing.assert_close(v(t, Y @ random_orthogonal(k)), ref, atol=1e-12, rtol=0)
    # and without labels the same swaps leave it unchanged
    plain = make_potential(n, k)
    with torch.no_grad():
        torch.testing.assert_close(plain(t, perm_action([2, 1, 0, 3, 4, 5]) @ Y), plain(t, Y),
                                   atol=1e-12, rtol=0)  # fmt: skip


# ------------------------------------------------------------------ the field
@pytest.mark.parametrize("n,k", CASES)
def test_field_is_horizontal_and_equivariant(n, k):
    # catches: a missing horizontal projection, or a field that is only invariant (X(YQ) = X(Y))
    # instead of equivariant, or not equivariant under relabelling
    f = GrassmannField(make_potential(n, k))
    Y = Grassmann(k, n - 1).random(6)
    t = torch.tensor(0.35)
    X = f(t, Y)
    assert X.norm(dim=(-2, -1)).min() > 1e-3  # a non-zero field
    torch.testing.assert_close(Y.mT @ X, torch.zeros(6, k, k), atol=1e-12, rtol=0)
    for reflect in (False, True):
        Q = random_orthogonal(k, reflect)
        torch.testing.assert_close(f(t, Y @ Q), X @ Q, atol=1e-11, rtol=0)
    for _ in range(2):
        U = perm_action(random_perm(n))
        torch.testing.assert_close(f(t, U @ Y), U @ X, atol=1e-11, rtol=0)


@pytest.mark.parametrize("n,k", CASES)
def test_laplace_beltrami_divergence_matches_generic(n, k):
    # catches: a wrong curvature term (D - k) tr(Y^T G), a non-horizontal basis or a missing
    # factor in the Hessian-vector-product trace
    f = GrassmannField(make_potential(n, k))
    Y = Grassmann(k, n - 1).random(5)
    t = torch.tensor(0.7)
    X_ref, div_ref = divergence_exact(lambda Z: f(t, Z), Y)
    assert div_ref.std() > 1e-2  # the divergence really varies
    for create_graph in (False, True):
        X, div = f.field_and_divergence(t, Y, create_graph=create_graph)
        torch.testing.assert_close(X, X_ref, atol=1e-10, rtol=0)
        torch.testing.assert_close(div, div_ref, atol=1e-10, rtol=0)
    # the divergence is a scalar on Gr(k, n - 1): invariant under O(k) and relabelling
    _, div_q = f.field_and_divergence(t, Y @ random_orthogonal(k), create_graph=False)
    _, div_u = f.field_and_divergence(t, perm_action(random_perm(n)) @ Y, create_graph=False)
    torch.testing.assert_close(div_q, div_ref, atol=1e-10, rtol=0)
    torch.testing.assert_close(div_u, div_ref, atol=1e-10, rtol=0)


def test_hutchinson_divergence_is_unbiased():
    # catches: probes that are not projected to the horizontal space (biased estimate)
    n, k, m = 5, 2, 4000
    f = GrassmannField(make_potential(n, k))
    Y = Grassmann(k, n - 1).random(1)
    t = torch.tensor(0.5)
    _, exact = f.field_and_divergence(t, Y, create_graph=False)
    Yr = Y.expand(m, -1, -1).contiguous()
    _, est = f.field_and_divergence(t, Yr, noise=torch.randn_like(Yr), create_graph=False)
    tol = mc_tolerance(est)
    assert tol < 0.1 * max(1.0, exact.abs().item())  # enough probes to see a bias
    assert abs(est.mean().item() - exact.item()) < tol


# ------------------------------------------------------------------ Wishart helpers
@pytest.mark.filterwarnings("ignore:Low df values detected")  # dof in (k - 1, k) is valid
@pytest.mark.parametrize("k", [1, 2, 3])
def test_wishart_log_prob_matches_torch(k):
    # catches: a wrong normalizer (log 2, multigamma, det V power) or tr(V S) instead of
    # tr(V^-1 S)
    B = 7
    V = random_spd(k, B)
    dof = k - 1 + 0.5 + 5 * torch.rand(B)
    S = random_spd(k, B)
    ref = torch.distributions.Wishart(dof, covariance_matrix=V).log_prob(S)
    torch.testing.assert_close(wishart_log_prob(S, dof, V), ref, atol=1e-10, rtol=0)
    # a float dof broadcasts
    ref3 = torch.distributions.Wishart(torch.tensor(k + 2.5), covariance_matrix=V).log_prob(S)
    torch.testing.assert_close(wishart_log_prob(S, k + 2.5, V), ref3, atol=1e-10, rtol=0)


def test_wishart_log_prob_is_equivariant():
    # catches: a density that is not a function of V^-1 S alone (e.g. using a Cholesky
    # factor of S in a fixed frame)
    k = 3
    V, S = random_spd(k, 4), random_spd(k, 4)
    ref = wishart_log_prob(S, 5.5, V)
    for reflect in (False, True):
        Q = random_orthogonal(k, reflect)
        torch.testing.assert_close(wishart_log_prob(Q.mT @ S @ Q, 5.5, Q.mT @ V @ Q), ref,
                                   atol=1e-12, rtol=0)  # fmt: skip


def test_wishart_sample_moments():
    # catches: Bartlett chi^2 degrees of freedom off by the row index, the normal entries in
    # the wrong triangle, or scaling by V instead of chol(V)
    k, m, dof = 3, 40000, 4.5
    V = torch.tensor([[1.0, 0.6, -0.3], [0.6, 2.0, 0.4], [-0.3, 0.4, 0.8]])
    gen = torch.Generator().manual_seed(3)
    S = wishart_sample(torch.tensor(dof), V.expand(m, k, k), gen)
    assert S.shape == (m, k, k)
    torch.testing.assert_close(S, S.mT, atol=0, rtol=0)
    assert (torch.linalg.eigvalsh(S) > 0).all()
    mean = dof * V
    for i in range(k):
        for j in range(i, k):
            x = S[:, i, j]
            tol = mc_tolerance(x)
            assert tol < 0.05 * mean[i, i].item()  # resolves the mean to a few percent
            assert abs(x.mean().item() - mean[i, j].item()) < tol
    # Var S_ij = dof (V_ij^2 + V_ii V_jj); Cov(S_00, S_11) = 2 dof V_01^2
    for i, j in [(0, 1), (1, 2), (2, 2)]:
        z = (S[:, i, j] - mean[i, j]).square()
        target = dof * (V[i, j] ** 2 + V[i, i] * V[j, j])
        tol = mc_tolerance(z)
        assert tol < 0.1 * target.item()
        assert abs(z.mean().item() - target.item()) < tol
    z = (S[:, 0, 0] - mean[0, 0]) * (S[:, 1, 1] - mean[1, 1])
    target = 2 * dof * V[0, 1] ** 2
    tol = mc_tolerance(z)
    assert tol < 0.25 * target.item()
    assert abs(z.mean().item() - target.item()) < tol


def test_wishart_sample_is_reproducible():
    # catches: a sampler that draws from the global RNG instead of the generator
    V = random_spd(2, 5)
    dof = torch.tensor([1.5, 2.0, 3.0, 7.0, 20.0])
    torch.manual_seed(1)
    a = wishart_sample(dof, V, torch.Generator().manual_seed(11))
    torch.manual_seed(2)
    b = wishart_sample(dof, V, torch.Generator().manual_seed(11))
    c = wishart_sample(dof, V, torch.Generator().manual_seed(12))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert (a - c).abs().max() > 1e-3


# ------------------------------------------------------------------ WishartGram
@pytest.mark.parametrize("n,k", CASES)
def test_wishart_gram_is_equivariant_and_permutation_invariant(n, k):
    # catches: Sigma built from Y instead of the points Y~ = H Y, weights that do not travel
    # with their points, or S and Y rotated inconsistently
    gram = make_gram(n, k)
    Y = Grassmann(k, n - 1).random(6)
    S = random_spd(k, 6)
    with torch.no_grad():
        Sigma, nu = gram.params(Y)
        ref = gram.log_prob(S, Y)
        assert nu.std() > 1e-2 and Sigma.std(0).max() > 1e-2  # really depends on Y
        assert (nu > k - 1).all() and (torch.linalg.eigvalsh(Sigma) > 0).all()
        for reflect in (False, True):
            Q = random_orthogonal(k, reflect)
            Sigma_q, nu_q = gram.params(Y @ Q)
            torch.testing.assert_close(Sigma_q, Q.mT @ Sigma @ Q, atol=1e-12, rtol=0)
            torch.testing.assert_close(nu_q, nu, atol=1e-12, rtol=0)
            torch.testing.assert_close(gram.log_prob(Q.mT @ S @ Q, Y @ Q), ref,
                                       atol=1e-11, rtol=0)  # fmt: skip
        for _ in range(2):
            U = perm_action(random_perm(n))
            torch.testing.assert_close(gram.log_prob(S, U @ Y), ref, atol=1e-11, rtol=0)
        # and the mean of the conditional law is Sigma (Wishart(nu, Sigma / nu))
        lp = wishart_log_prob(S, nu, Sigma / nu[:, None, None])
        torch.testing.assert_close(ref, lp, atol=1e-12, rtol=0)


# torch's Wishart.rsample warns "Singular sample detected" for valid samples (it tests the
# support check without negating it) and redraws them; the redraws are still Wishart
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Singular sample detected")
@pytest.mark.parametrize("n,k", CASES)
def test_wishart_gram_normalizes(n, k):
    # catches: a conditional density that is not normalized over SPD(k) (the Cartesian
    # density would then not integrate to one)
    # E_{S ~ q}[p(S | Y) / q(S)] = 1 with q = Wishart(nu, c Sigma / nu), c > 1: with the same
    # dof the ratio is bounded by c^{nu k / 2}, so the weights have all their moments
    gram = make_gram(n, k, dof=6.0)
    Y = Grassmann(k, n - 1).random(3)
    m, c = 40000, 1.3
    with torch.no_grad():
        Sigma, nu = gram.params(Y)
        assert nu.std() > 1e-2
        for i in range(3):
            q = torch.distributions.Wishart(nu[i], covariance_matrix=c * Sigma[i] / nu[i])
            S = q.sample((m,))
            w = torch.exp(gram.log_prob(S, Y[i].expand(m, -1, -1)) - q.log_prob(S))
            tol = mc_tolerance(w)
            assert tol / 4 <= 0.01  # standard error <= 0.01
            assert w.std() > 0.1  # the proposal is not the model itself
            assert abs(w.mean().item() - 1.0) < tol


def test_wishart_gram_sample_matches_log_prob():
    # catches: sample using another scale or dof than log_prob (e.g. Sigma instead of
    # Sigma / nu, so E[S] = nu Sigma)
    n, k, m = 5, 2, 20000
    gram = make_gram(n, k, dof=6.0)
    Y = Grassmann(k, n - 1).random(1).expand(m, -1, -1)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        S = gram.sample(Y, gen)
        Sigma, nu = gram.params(Y[:1])
    for i, j in [(0, 0), (0, 1), (1, 1)]:
        tol = mc_tolerance(S[:, i, j])
        assert tol < 0.05 * Sigma[0, i, i].item()
        assert abs(S[:, i, j].mean().item() - Sigma[0, i, j].item()) < tol
    z = (S[:, 0, 1] - Sigma[0, 0, 1]).square()
    V = Sigma[0] / nu[0]
    target = nu[0] * (V[0, 1] ** 2 + V[0, 0] * V[1, 1])
    assert abs(z.mean().item() - target.item()) < mc_tolerance(z)


def test_wishart_gram_initialize_sets_mean_trace():
    # catches: initialize setting log(trace) instead of log(trace / k), or the bias of the dof
    # head instead of the weight head
    n, k, m = 6, 3, 20000
    gram = WishartGram(n, k, hidden=8)
    A = torch.randn(50, k, 5)
    data = 2.7 * A @ A.mT
    target = torch.diagonal(data, dim1=-2, dim2=-1).sum(-1).mean().item()
    gram.initialize(data)
    Y = Grassmann(k, n - 1).random(4)
    with torch.no_grad():
        Sigma, _ = gram.params(Y)
        # fresh module: all weights equal, Sigma = (target / k) I for every Y
        torch.testing.assert_close(Sigma, target / k * torch.eye(k).expand(4, k, k),
                                   atol=1e-12, rtol=0)  # fmt: skip
        S = gram.sample(Y[:1].expand(m, -1, -1), torch.Generator().manual_seed(2))
    tr = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1)
    tol = mc_tolerance(tr)
    assert tol < 0.02 * target
    assert abs(tr.mean().item() - target) < tol
    with pytest.raises(ValueError):
        WishartGram(n, k, dof=k - 1.0)


def make_mixture(n: int, k: int, components: int = 3) -> WishartGram:
    """A WishartGram mixture whose scales, dofs and weights all depend on Y."""
    gram = WishartGram(n, k, hidden=16, layers=1, dof=6.0, components=components)
    scale_init_(gram.graph, 2.0)
    with torch.no_grad():
        for head in (gram.weight, gram.log_dof, gram.logits):
            head.weight.normal_(std=0.3)
    return gram


def test_wishart_gram_mixture_log_prob_sample_and_equivariance():
    # catches: a mixture that is not the pi-weighted sum of its components' Wisharts (weights
    # not normalized, logsumexp over the wrong axis), components that do not rotate with Y, a
    # sampler that picks components with other weights than log_prob's (its mean would not be
    # sum_c pi_c Sigma_c), and an initialization that leaves the components identical
    n, k, m = 5, 2, 30000
    gram = make_mixture(n, k)
    Y = Grassmann(k, n - 1).random(4)
    S = random_spd(k, 4)
    with torch.no_grad():
        Sigma, nu, log_pi = gram.mixture_params(Y)
        assert Sigma.shape == (4, 3, k, k) and nu.shape == log_pi.shape == (4, 3)
        torch.testing.assert_close(log_pi.exp().sum(-1), torch.ones(4), atol=1e-12, rtol=0)
        assert log_pi.std() > 1e-2 and (Sigma[:, 0] - Sigma[:, 2]).abs().max() > 0.1
        by_hand = torch.stack([
            log_pi[:, c] + wishart_log_prob(S, nu[:, c], Sigma[:, c] / nu[:, c, None, None])
            for c in range(3)
        ]).exp().sum(0).log()  # fmt: skip
        ref = gram.log_prob(S, Y)
        torch.testing.assert_close(ref, by_hand, atol=1e-10, rtol=0)
        for reflect in (False, True):
            Q = random_orthogonal(k, reflect)
            torch.testing.assert_close(gram.log_prob(Q.mT @ S @ Q, Y @ Q), ref,
                                       atol=1e-11, rtol=0)  # fmt: skip
        torch.testing.assert_close(gram.log_prob(S, perm_action(random_perm(n)) @ Y), ref,
                                   atol=1e-11, rtol=0)  # fmt: skip
        draws = gram.sample(Y[:1].expand(m, -1, -1), torch.Generator().manual_seed(3))
        mean = (log_pi[0].exp()[:, None, None] * Sigma[0]).sum(0)
    for i, j in [(0, 0), (0, 1), (1, 1)]:
        tol = mc_tolerance(draws[:, i, j])
        assert tol < 0.05 * mean[i, i].item()
        assert abs(draws[:, i, j].mean().item() - mean[i, j].item()) < tol
    with pytest.raises(ValueError, match="mixture_params"):
        gram.params(Y)
    with pytest.raises(ValueError, match="components"):
        WishartGram(n, k, components=0)


def test_wishart_gram_mixture_initialize_breaks_the_symmetry():
    # catches: an initialization that leaves the components of a fresh mixture identical (no
    # spread of their scales): the mixture is then one Wishart, every component gets the same
    # gradient, and training can never separate them. After initialize on data the components'
    # scales must differ and bracket the data's, and the gradient must tell them apart.
    n, k, C = 5, 2, 4
    gram = WishartGram(n, k, hidden=8, components=C)
    A = torch.randn(200, k, 6)
    data = 2.7 * A @ A.mT
    gram.initialize(data)
    scale = torch.diagonal(data, dim1=-2, dim2=-1).sum(-1).mean().item() / k
    Y = Grassmann(k, n - 1).random(200)
    Sigma, nu, log_pi = gram.mixture_params(Y)
    c = torch.diagonal(Sigma, dim1=-2, dim2=-1).mean(-1)  # (200, C): Sigma = c I on a fresh one
    torch.testing.assert_close(Sigma, c[..., None, None] * torch.eye(k), atol=1e-12, rtol=0)
    c = c[0].detach().sort().values
    assert (c[1:] / c[:-1]).min() > 1.2  # C distinct scales
    assert c[0] < scale < c[-1]
    (-gram.log_prob(data, Y).mean()).backward()
    g = gram.weight.bias.grad
    assert (g.max() - g.min()).item() > 0.1 * g.abs().max().item()  # symmetry broken


def test_wishart_gram_mixture_normalizes():
    # catches: mixture weights that do not sum to one (the Cartesian density would then not
    # integrate to one) -- importance sampling from the same mixture with every scale widened
    # by c, so that each weight is bounded by max_c c^(nu_c k / 2)
    n, k, m, c = 5, 2, 40000, 1.2
    gram = make_mixture(n, k)
    Y = Grassmann(k, n - 1).random(1)
    with torch.no_grad():
        Sigma, nu, log_pi = (x[0] for x in gram.mixture_params(Y))
        comp = torch.multinomial(log_pi.exp(), m, replacement=True)
        S = torch.cat([
            torch.distributions.Wishart(nu[j], covariance_matrix=c * Sigma[j] / nu[j]).sample(
                ((comp == j).sum().item(),))
            for j in range(3)
        ])  # fmt: skip
        log_q = torch.logsumexp(torch.stack([
            log_pi[j] + wishart_log_prob(S, nu[j], c * Sigma[j] / nu[j]) for j in range(3)
        ]), 0)  # fmt: skip
        w = torch.exp(gram.log_prob(S, Y.expand(m, -1, -1)) - log_q)
    tol = mc_tolerance(w)
    assert tol / 4 <= 0.01 and w.std() > 0.1
    assert abs(w.mean().item() - 1.0) < tol
