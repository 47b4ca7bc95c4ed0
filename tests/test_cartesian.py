import math

import pytest
import torch
from scipy.special import multigammaln

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions import MatrixGaussianPrior
from grassflow.distributions.cartesian import (
    cartesian_log_prob,
    cartesian_log_prob_gram,
    log_jacobian,
    log_volume_orthogonal,
    wishart_eigenvalue_log_prob,
)
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import shape_factor

CASES = [(3, 1), (3, 2), (5, 2), (6, 3), (18, 3)]


def uniform_gr(k, n):
    return lambda Y: Y.new_full(Y.shape[:-2], -Grassmann(k, n).log_volume())


def wishart_eigs_reference(lam, n, s2):
    # Muirhead Thm 3.2.18 for W_k(n, s2 I), written out independently of the module
    k = lam.shape[-1]
    i, j = torch.triu_indices(k, k, offset=1)
    return (
        0.5 * k * k * math.log(math.pi)
        - 0.5 * n * k * math.log(2 * s2)
        - multigammaln(k / 2, k)
        - multigammaln(n / 2, k)
        - lam.sum(-1) / (2 * s2)
        + 0.5 * (n - k - 1) * lam.log().sum(-1)
        + (lam[..., i] - lam[..., j]).log().sum(-1)
    )


def skew(v, k):
    A = torch.zeros(k, k, dtype=v.dtype)
    i, j = torch.triu_indices(k, k, offset=1)
    A = A.index_put((i, j), v)
    return A - A.T


def stiefel_chart(H0, C, a):
    """U = H0 expm([[A, -C^T], [C, 0]])[:, :k]: dU = U0 A + U0_perp C at 0 (canonical metric)."""
    n, k = H0.shape[0], C.shape[1]
    G = torch.zeros(n, n, dtype=C.dtype)
    G = torch.cat([torch.cat([skew(a, k), -C.T], 1), torch.cat([C, G[k:, k:]], 1)], 0)
    return (H0 @ torch.linalg.matrix_exp(G))[:, :k]


# ------------------------------------------------------------------ the volume element
def test_orthogonal_group_volumes():
    assert math.exp(log_volume_orthogonal(1)) == pytest.approx(2.0)
    assert math.exp(log_volume_orthogonal(2)) == pytest.approx(4 * math.pi)
    assert math.exp(log_volume_orthogonal(3)) == pytest.approx(16 * math.pi**2)
    # Vol St(n, k) (canonical metric, Muirhead Thm 2.1.15) = V_Gr(k, n) Vol O(k)
    for n, k in CASES:
        log_st = k * math.log(2) + 0.5 * n * k * math.log(math.pi) - multigammaln(n / 2, k)
        assert Grassmann(k, n).log_volume() + log_volume_orthogonal(k) == pytest.approx(log_st)


@pytest.mark.parametrize("n,k", [(3, 2), (5, 2), (4, 3), (4, 1)])
def test_svd_chart_jacobian(n, k):
    # exact Jacobian of (C, lam, A, Om) -> U diag(sqrt lam) V^T in coordinates orthonormal for
    # the tr metric on Gr and (1/2)||.||^2 on both O(k) factors: the local factor is
    # 2^-k prod lam^{(n-k-1)/2} prod (lam_i - lam_j) = exp(L) 2^k / Vol(O(k))^2 (the other 2^k
    # in exp(L) is the sign ambiguity (U, V) ~ (U S, V S), a global, not a local, factor)
    H0, V0 = random_orthogonal(n), random_orthogonal(k)
    lam0 = torch.sort(torch.rand(k) * 3 + 0.2, descending=True).values
    m, p = (n - k) * k, k * (k - 1) // 2

    def P_of(x):
        C, lam = x[:m].reshape(n - k, k), x[m : m + k]
        a, w = x[m + k : m + k + p], x[m + k + p :]
        U = stiefel_chart(H0, C, a)
        V = V0 @ torch.linalg.matrix_exp(skew(w, k))
        return (U * lam.sqrt()) @ V.T

    x0 = torch.cat([torch.zeros(m), lam0, torch.zeros(2 * p)])
    J = torch.autograd.functional.jacobian(lambda x: P_of(x).reshape(-1), x0)
    logdet = torch.linalg.slogdet(J)[1]
    expected = log_jacobian(lam0, n) - 2 * log_volume_orthogonal(k) + k * math.log(2)
    assert logdet.item() == pytest.approx(expected.item(), abs=1e-10)


@pytest.mark.parametrize("n,k", [(3, 2), (5, 2), (6, 3)])
def test_issue_volume_element_det_B_power(n, k):
    # the issue's claim dP = |det B|^{n-k} dvol_Gr([Y]) dB for P = Y(C) B, Y(C) a local section
    H0, B0 = random_orthogonal(n), torch.randn(k, k)
    m = (n - k) * k

    def P_of(x):
        Y = stiefel_chart(H0, x[:m].reshape(n - k, k), torch.zeros(k * (k - 1) // 2))
        return (Y @ x[m:].reshape(k, k)).reshape(-1)

    J = torch.autograd.functional.jacobian(P_of, torch.cat([torch.zeros(m), B0.reshape(-1)]))
    expected = (n - k) * torch.linalg.slogdet(B0)[1]
    assert torch.linalg.slogdet(J)[1].item() == pytest.approx(expected.item(), abs=1e-10)


# ---------------------------------------------------------------- exact identities
@pytest.mark.parametrize("n,k", CASES)
@pytest.mark.parametrize("s2", [1.0, 0.3])
def test_gaussian_identity(n, k, s2):
    # i.i.d. N(0, s2) entries: [Y] uniform, lam ~ eigenvalues of W_k(n, s2 I), R Haar
    P = s2**0.5 * torch.randn(64, n, k)
    lp = cartesian_log_prob(P, uniform_gr(k, n), lambda lam, Y: wishart_eigs_reference(lam, n, s2))
    ref = -0.5 * n * k * math.log(2 * math.pi * s2) - P.square().sum((-2, -1)) / (2 * s2)
    assert torch.allclose(lp, ref, rtol=0, atol=1e-10)
    lam = shape_factor(P)[1]
    helper = wishart_eigenvalue_log_prob(lam, n, s2)
    assert torch.allclose(helper, wishart_eigs_reference(lam, n, s2), rtol=0, atol=1e-10)


def macg_log_prob(M_inv, logdet_M, n, k):
    # matrix angular central Gaussian: law of span(M^{1/2} Z) (Chikuse 2003), w.r.t. dvol_Gr
    def f(Y):
        return (-0.5 * k * logdet_M - 0.5 * n * torch.logdet(Y.mT @ M_inv @ Y)
                - Grassmann(k, n).log_volume())  # fmt: skip

    return f


@pytest.mark.parametrize("n,k", [(3, 2), (5, 2), (18, 3)])
def test_gram_identity_row_correlated_gaussian(n, k):
    # P = M^{1/2} Z: [Y] ~ MACG(M) and S = Y^T P P^T Y | Y ~ W_k(n, (Y^T M^-1 Y)^-1), whose
    # principal axes are NOT uniform within [Y]
    A = torch.randn(n, n)
    M = A @ A.T / n + 0.5 * torch.eye(n)
    M_inv, logdet_M = torch.linalg.inv(M), torch.logdet(M)
    P = torch.linalg.cholesky(M) @ torch.randn(64, n, k)

    def gram(S, Y):
        cov = torch.linalg.inv(Y.mT @ M_inv @ Y)
        return torch.distributions.Wishart(torch.tensor(float(n)), cov).log_prob(S)

    lp = cartesian_log_prob_gram(P, macg_log_prob(M_inv, logdet_M, n, k), gram)
    quad = (P * (M_inv @ P)).sum((-2, -1))
    ref = -0.5 * n * k * math.log(2 * math.pi) - 0.5 * k * logdet_M - 0.5 * quad
    assert torch.allclose(lp, ref, rtol=0, atol=1e-9)


# --------------------------------------------------------- Monte Carlo normalization
def gamma_pair_log_prob(a, rate_of):
    """(lam_1 - lam_2) f(lam_1) f(lam_2) / Z on lam_1 > lam_2, f = Gamma(a, rate(Y)).

    Z = E|X - X'| / 2 = Gamma(a + 1/2) / (rate sqrt(pi) Gamma(a)). The repulsion factor keeps
    p(P) bounded, so p/q has finite variance (without it Var diverges logarithmically).
    """

    def f(lam, Y):
        b = rate_of(Y)[..., None]
        logf = a * b.log() - math.lgamma(a) + (a - 1) * lam.log() - b * lam
        logZ = math.lgamma(a + 0.5) - b[..., 0].log() - 0.5 * math.log(math.pi) - math.lgamma(a)
        return (lam[..., 0] - lam[..., 1]).log() + logf.sum(-1) - logZ

    return f


@pytest.mark.slow
@pytest.mark.parametrize("model", ["eigen", "gram"])
def test_normalization_monte_carlo(model):
    n, k, N, s = 3, 2, 200_000, 1.2
    gr = Grassmann(k, n)
    M0 = gr.random()
    A = torch.randn(n, n)
    prior = MatrixGaussianPrior(gr, M0, 0.25 * (torch.eye(n) + 0.3 * A @ A.T / n),
                                torch.tensor([[1.0, 0.3], [0.3, 0.6]]))  # fmt: skip
    if model == "eigen":
        # lam's law depends on the canonical Y (incl. the in-plane orientation of its columns)
        scale = gamma_pair_log_prob(2.5, lambda Y: 1.0 + 0.5 * Y[..., 0, 0].square())
        log_p = lambda P: cartesian_log_prob(P, prior.log_prob, scale)
    else:
        Mc = torch.eye(n) + 0.5 * A @ A.T / n

        def gram(S, Y):  # W_2(4.5, Y^T Mc Y / 2): equivariant, non-uniform principal axes
            return torch.distributions.Wishart(torch.tensor(4.5), Y.mT @ Mc @ Y / 2).log_prob(S)

        log_p = lambda P: cartesian_log_prob_gram(P, prior.log_prob, gram)
    # importance sampling from q = N(0, s^2) on R^{3x2}: int p dP = E_q[p / q]
    P = s * torch.randn(N, n, k)
    log_q = -0.5 * n * k * math.log(2 * math.pi * s**2) - P.square().sum((-2, -1)) / (2 * s**2)
    w = torch.exp(log_p(P) - log_q)
    assert mc_tolerance(w) < 0.05  # the check has teeth
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))


# ------------------------------------------------------------------------ invariance
def make_models(n, k):
    gr = Grassmann(k, n)
    prior = MatrixGaussianPrior(gr, gr.random(), 0.5 * torch.eye(n), torch.eye(k))
    scale = lambda lam, Y: wishart_eigenvalue_log_prob(lam, n + 1.5, 1.0 + Y[..., 0, 0].square())
    W = torch.randn(n, n)
    gram = lambda S, Y: torch.distributions.Wishart(
        torch.tensor(n + 0.5), Y.mT @ (W @ W.T + torch.eye(n)) @ Y
    ).log_prob(S)
    return prior, scale, gram


@pytest.mark.parametrize("n,k", [(3, 2), (5, 2), (18, 3)])
@pytest.mark.parametrize("reflect", [False, True])
def test_rotation_invariance(n, k, reflect):
    prior, scale, gram = make_models(n, k)
    P = torch.randn(16, n, k)
    PR = P @ random_orthogonal(k, reflect)
    Y, lam, _ = shape_factor(P)
    Y2, lam2, _ = shape_factor(PR)
    # the canonical Y is a function of P P^T: callables see the same Y after P -> P R
    assert torch.allclose(Y, Y2, atol=1e-10) and torch.allclose(lam, lam2, atol=1e-10)
    for fn, cond in ((cartesian_log_prob, scale), (cartesian_log_prob_gram, gram)):
        assert torch.allclose(fn(PR, prior.log_prob, cond), fn(P, prior.log_prob, cond),
                              rtol=0, atol=1e-9)  # fmt: skip


def test_grassmann_callable_sees_the_span_and_any_representative_works():
    n, k = 5, 2
    prior, scale, _ = make_models(n, k)
    P = torch.randn(8, n, k)
    seen = []

    def record(Y):
        seen.append(Y)
        return prior.log_prob(Y)

    lp = cartesian_log_prob(P, record, scale)
    assert Grassmann(k, n).same_subspace(P, seen[0]).all()
    Q = random_orthogonal(k)
    other = cartesian_log_prob(P, lambda Y: prior.log_prob(Y @ Q), scale)
    assert torch.allclose(lp, other, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------ factor, errors
@pytest.mark.parametrize("n,k", CASES)
def test_shape_factor_round_trip(n, k):
    P = torch.randn(2, 3, n, k)
    Y, lam, R = shape_factor(P)
    assert Y.shape == P.shape and lam.shape == (2, 3, k) and R.shape == (2, 3, k, k)
    assert torch.allclose((Y * lam.sqrt().unsqueeze(-2)) @ R.mT, P, atol=1e-12)
    assert torch.allclose(R.mT @ R, torch.eye(k).expand_as(R), atol=1e-12)
    assert (lam[..., :-1] >= lam[..., 1:]).all() and (lam > 0).all()
    assert torch.allclose(lam, torch.linalg.eigvalsh(P.mT @ P).flip(-1), atol=1e-10)
    assert torch.equal(Y, Grassmann(k, n).from_point_cloud(P, "eig"))


def test_bad_inputs():
    scale = lambda lam, Y: wishart_eigenvalue_log_prob(lam, 5)
    gr = uniform_gr(2, 5)
    with pytest.raises(ValueError, match="torch.Tensor"):
        shape_factor([[1.0, 2.0]])
    with pytest.raises(ValueError, match="floating"):
        shape_factor(torch.ones(5, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="1 <= k < n"):
        shape_factor(torch.randn(3, 3))
    P = torch.randn(4, 5, 2)
    P[1, 2, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        cartesian_log_prob(P, gr, scale)
    P = torch.randn(4, 5, 2)
    P[1, :, 1] = 2 * P[1, :, 0]
    P[3] = 0.0
    with pytest.raises(ValueError, match="2 configuration"):
        shape_factor(P)
    P = torch.randn(4, 5, 2)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        cartesian_log_prob(P, lambda Y: torch.zeros(()), scale)
    with pytest.raises(ValueError, match="dtype"):
        cartesian_log_prob(P, lambda Y: torch.zeros(4, dtype=torch.float32), scale)
    with pytest.raises(ValueError, match="descending"):
        log_jacobian(torch.tensor([1.0, 2.0]), 5)
    with pytest.raises(ValueError, match="positive"):
        log_jacobian(torch.tensor([1.0, -2.0]), 5)
    with pytest.raises(ValueError, match="n must be"):
        log_jacobian(torch.tensor([2.0, 1.0]), 2)
    with pytest.raises(ValueError, match="dof"):
        wishart_eigenvalue_log_prob(torch.tensor([2.0, 1.0]), 0.5)
    with pytest.raises(ValueError, match="scale"):
        wishart_eigenvalue_log_prob(torch.tensor([2.0, 1.0]), 3.0, -1.0)
