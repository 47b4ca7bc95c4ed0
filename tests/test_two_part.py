"""Tests for grassflow_paper.two_part.TwoPartShapeFlow: the exact density on point clouds.

The density lives on the (n - 1) d CoM-free Helmert coordinates ``P' = H^T (P - mean)``. Its
values are checked against closed forms (a TwoPartShapeFlow that is an isotropic Gaussian) and a
brute-force recomputation of each term, and its normalization against an isotropic Gaussian
proposal ``q(P') = N(0, s^2 I)`` in both directions: ``E_q[p / q] = 1`` (log_prob alone) and
``E_{P ~ model}[q / p] = 1`` (sample and log_prob together). The Gaussian's own decomposition is
``[Y]`` uniform and ``S | Y ~ Wishart(n - 1, s^2 I)``, so the model is set up to resemble it,
which keeps the weights' variance small: an untrained graph potential scaled by
``scale_init_`` (the Grassmann part moves mass), and a WishartGram whose weights w_i(Y) and dof
nu(Y) really depend on Y, centred at Sigma ~ I and nu ~ n - 1, with s^2 = 1 / (n - 1). The
slow normalization tests draw the spans [Y] from a quadrature rule (tests/quadrature.py) and
only S and the orientation at random, which resolves a 1% error with a few thousand clouds.

Finite variance of the weights is a guard, not an assumption. dP' = det(S)^((n - d - 2) / 2)
dvol_Gr dS dR up to a constant (R the Haar fibre), and that factor cancels in p / q, so

* ``p / q`` has finite variance iff ``nu > (n + d - 2) / 2`` (near S = 0) and
  ``Sigma / nu < 2 s^2`` (tails);
* ``q / p`` has finite variance iff ``nu < 2 n - d - 1`` and ``Sigma / nu > s^2 / 2``;

and the Grassmann density of a flow from the uniform prior is bounded above and below.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions.cartesian import wishart_log_prob
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn import scale_init_
from grassflow_paper.gram_densities import WishartGram
from grassflow_paper.two_part import TwoPartShapeFlow
from quadrature import grassmann_rule, log_volume_grassmann

TOL = {"atol": 1e-6, "rtol": 1e-6}
# (n, d, field RMS, clouds per estimator): Gr(2, 3) with 6 coordinates and Gr(3, 4) with 12;
# the field is strong enough to move mass (the power guards) and weak enough for importance
# weights to keep a standard error <= 0.01 (checked for six initializations, not only the
# seeded one)
MC_CASES = [(4, 2, 0.065, 4000), (5, 3, 0.055, 2500)]


def calibrate_gram(model: TwoPartShapeFlow, dof: float, w_spread: float = 0.15,
                   dof_spread: float = 0.05) -> None:  # fmt: skip
    """Give the WishartGram's (zero-initialized) weight and dof heads random weights, scaled so
    that over uniform Y the log-weights log w_i have standard deviation ``w_spread`` around 0
    (Sigma ~ I) and log(nu - d + 1) has standard deviation ``dof_spread`` around
    log(dof - d + 1)."""
    gram, d = model.gram, model.dim
    scale_init_(gram.graph, 2.0)
    with torch.no_grad():
        h = gram.graph(torch.tensor(0.0), Grassmann(d, model.n_points - 1).random(200))
        for head, x, centre, spread in [
            (gram.weight, h, 0.0, w_spread),
            (gram.log_dof, h.mean(-2), math.log(dof - d + 1), dof_spread),
        ]:
            head.weight.normal_()
            a = head(x) - head.bias
            head.weight.mul_(spread / a.std())
            head.bias.fill_(centre - spread * (a.mean() / a.std()).item())


def make_model(
    n: int, d: int, gain: float = 2.0, field_rms: float | None = None, **kwargs
) -> TwoPartShapeFlow:
    """An untrained TwoPartShapeFlow: potential weights scaled by ``gain`` (nonlinear
    features); with ``field_rms`` the potential's output layer is rescaled so that the field's
    RMS norm over uniform [Y] at t = T / 2 is ``field_rms`` (how far the flow moves mass,
    whatever the random initialization); the Gram density from :func:`calibrate_gram`."""
    field = kwargs.pop("field", "graph")
    options = {"widths": kwargs.pop("widths")} if field == "mlp" else {"hidden": 8}
    kwargs = {"field_options": options, "gram_options": {"hidden": 8}, **TOL, **kwargs}
    model = TwoPartShapeFlow(n, d, field, **kwargs).eval()
    field = scale_init_(model.flow.field, gain)
    if field_rms is not None:
        X = field(0.5 * model.flow.T.detach(), Grassmann(d, n - 1).random(500))
        with torch.no_grad():
            field.potential.out.weight.mul_(field_rms / X.square().sum((-2, -1)).mean().sqrt())
    calibrate_gram(model, dof=n - 1.0)
    return model


def gaussian_log_prob(Pp: torch.Tensor, s2: float) -> torch.Tensor:
    """log N(P'; 0, s2 I) on the (n - 1) d Helmert coordinates."""
    dim = Pp.shape[-2] * Pp.shape[-1]
    return -0.5 * Pp.square().sum((-2, -1)) / s2 - 0.5 * dim * math.log(2 * math.pi * s2)


def assert_finite_variance(model, Y, s2, direction):
    """The guard of the module docstring, on the representatives that were drawn."""
    n, d = model.n_points, model.dim
    with torch.no_grad():
        Sigma, nu = model.gram.params(Y)
    ev = torch.linalg.eigvalsh(Sigma / nu[:, None, None])
    if direction == "p/q":
        assert nu.min() > (n + d - 2) / 2 and ev.max() < 2 * s2
    else:
        assert nu.max() < 2 * n - d - 1 and ev.min() > s2 / 2
    return Sigma, nu


@pytest.fixture(scope="module", params=MC_CASES, ids=[f"n{c[0]}d{c[1]}" for c in MC_CASES])
def mc(request):
    """One model per case, with log_prob_terms on m Gaussian clouds and on m model samples
    (computed once, shared by the Monte Carlo tests of the sampler)."""
    n, d, rms, m = request.param
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = make_model(n, d, field_rms=rms, chunk_size=1024)  # several chunks per batch
        s2 = 1.0 / (n - 1)
        Pp = math.sqrt(s2) * torch.randn(m, n - 1, d)
        with torch.no_grad():
            terms_q = model.log_prob_terms(helmert_basis(n) @ Pp)
            samples = model.sample(m, torch.Generator().manual_seed(1))
            terms_m = model.log_prob_terms(samples)
        return SimpleNamespace(n=n, d=d, m=m, model=model, s2=s2, Pp=Pp, terms_q=terms_q,
                               samples=samples, terms_m=terms_m)  # fmt: skip
    finally:
        torch.set_default_dtype(old)


# ------------------------------------------------------------------ normalization
# (n, d, field RMS, rule order, clouds per span): Gr(2, 3) with 151 spans of the quadrature and
# Gr(3, 4) with 495 (tests/quadrature.py), whose error on these flows' Grassmann parts is
# <= 1e-4 (QUAD_ERR bounds it); the Gram density is closer to the proposal's than in the
# Monte Carlo cases, so that the standard error is ~0.001 and a 1% error fails
QUAD_CASES = [(4, 2, 0.065, 29, 12), (5, 3, 0.055, 17, 8)]
QUAD_ERR = 2e-4


def haar(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """``m`` Haar-distributed ``(d, d)`` orthogonal matrices (QR with the sign fix)."""
    Q, R = torch.linalg.qr(torch.randn(m, d, d, generator=generator))
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def stratified_mean(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    """``sum_i w_i mean_j x_ij`` and its standard error, for ``x: (N, K)`` with K independent
    draws at each of the N nodes of a rule with weights ``w: (N,)``."""
    K = x.shape[1]
    se = (w.square() * x.var(dim=1) / K).sum().sqrt().item()
    return (w * x.mean(dim=1)).sum().item(), se


@pytest.fixture(scope="module", params=QUAD_CASES, ids=[f"n{c[0]}d{c[1]}" for c in QUAD_CASES])
def quad(request):
    """One model per case; K clouds on each span Y_i of the rule, drawn from the Gaussian's
    conditional law (S = G^T G ~ Wishart(n - 1, s2 I), P' = Y_i chol(S) R, R Haar), and K
    model samples on each transported span phi(Y_i) (the flow's prior is uniform, so the
    nodes are a rule for its prior), with their log_prob."""
    n, d, rms, order, K = request.param
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = make_model(n, d, field_rms=rms, chunk_size=1024)  # several chunks per batch
        calibrate_gram(model, dof=n - 1.0, w_spread=0.05, dof_spread=0.02)
        s2 = 1.0 / (n - 1)
        Y, w = grassmann_rule(d, n - 1, order)
        gen = torch.Generator().manual_seed(1)
        G = math.sqrt(s2) * torch.randn(len(w) * K, n - 1, d, generator=gen)
        B = torch.linalg.cholesky(G.mT @ G) @ haar(len(w) * K, d, gen)
        Pp = Y.repeat_interleave(K, 0) @ B
        with torch.no_grad():
            log_gr = model.flow.log_prob(Y)
            lp_q = model.log_prob(helmert_basis(n) @ Pp)
            Y1 = model.flow.transport_forward(Y)
            samples = model.sample_given(Y1.repeat_interleave(K, 0), gen)
            lp_m = model.log_prob(samples)
        return SimpleNamespace(n=n, d=d, K=K, model=model, s2=s2, Y=Y, w=w, log_gr=log_gr,
                               Pp=Pp, lp_q=lp_q, Y1=Y1, samples=samples,
                               lp_m=lp_m)  # fmt: skip
    finally:
        torch.set_default_dtype(old)


@pytest.mark.slow
def test_normalized_under_gaussian_proposal(quad):
    # catches: a wrong Jacobian (|det B|^{n-k} power, 2^k, pi or multigamma constants), an
    # unnormalized Gram density, Grassmann volume conventions that do not match, or log p off
    # by a constant, to 1%: int p(P') dP' = E_q[p / q] = 1
    model = quad.model
    # the flow really moves mass and the Gram density really depends on Y
    assert (quad.log_gr + log_volume_grassmann(quad.d, quad.n - 1)).abs().max() > 0.3
    Y, _ = model.factor(helmert_basis(quad.n) @ quad.Pp)
    Sigma, nu = assert_finite_variance(model, Y, quad.s2, "p/q")
    assert nu.std() > 0.02 and Sigma.std(0).max() > 0.01
    w = torch.exp(quad.lp_q - gaussian_log_prob(quad.Pp, quad.s2))
    mean, se = stratified_mean(w.reshape(-1, quad.K), quad.w)
    tol = 4 * se + QUAD_ERR
    assert tol < 0.006, tol  # power: a 1% error is > tol + 2.5 standard errors away
    assert abs(mean - 1.0) < tol, (mean, se)


@pytest.mark.slow
def test_normalized_under_model_samples(quad):
    # catches: a sampler and a density that disagree (flow run the wrong way or not at all, S
    # drawn for another scale), or a density that is not normalized, to 1%:
    # E_{P ~ p}[q(P') / p(P')] = int q = 1
    model, P = quad.model, quad.samples
    assert model.manifold.dist(quad.Y, quad.Y1).max() > 0.05  # the transport moves spans
    Y, _ = model.factor(P)
    assert_finite_variance(model, Y, quad.s2, "q/p")
    w = torch.exp(gaussian_log_prob(model.helmert(P), quad.s2) - quad.lp_m)
    mean, se = stratified_mean(w.reshape(-1, quad.K), quad.w)
    tol = 4 * se + QUAD_ERR
    assert tol < 0.006, tol
    assert abs(mean - 1.0) < tol, (mean, se)


@pytest.mark.slow
def test_sample_statistic_matches_importance_weighted_log_prob(mc):
    # catches: samples whose span follows another law than log_prob's Grassmann term (the
    # flow's prior, or the transport run backwards)
    # f([Y]) = log(V_Gr p_Gr([Y])): E_p[f] from the samples vs E_{[Y] uniform}[V_Gr p_Gr f]
    # from the Gaussian clouds, whose spans are uniform
    log_vol = log_volume_grassmann(mc.d, mc.n - 1)
    f_model = mc.terms_m["grassmann"] + log_vol
    f_uniform = mc.terms_q["grassmann"] + log_vol
    wf = f_uniform.exp() * f_uniform
    se = math.hypot(f_model.std().item(), wf.std().item()) / mc.m**0.5
    # power: a sampler that ignores the flow (mean of f_uniform) would be > 6 se away
    assert abs(f_model.mean().item() - f_uniform.mean().item()) > 6 * se
    assert abs(f_model.mean().item() - wf.mean().item()) < 4 * se


@pytest.mark.slow
def test_samples_are_isotropic(mc):
    # catches: a sampler without the Haar rotation R of the coordinates (P' = Y chol(S)): the
    # density is O(d)-invariant, so its samples' normalized second moment E[P'^T P' / tr] must
    # be I / d, which the weighted checks above cannot see (their weights are O(d)-invariant)
    Pp = mc.model.helmert(mc.samples)
    M = Pp.mT @ Pp
    M = M / torch.diagonal(M, dim1=-2, dim2=-1).sum(-1)[:, None, None]
    d = mc.d
    for i in range(d):
        for j in range(i, d):
            x = M[:, i, j] - (1.0 / d if i == j else 0.0)
            tol = mc_tolerance(x)
            assert tol < 0.05  # resolves an anisotropy of a few percent of tr
            assert abs(x.mean().item()) < tol


@pytest.mark.slow
@pytest.mark.parametrize("n,d", [(4, 2), (5, 3)])
def test_sampled_gram_follows_the_conditional_law(n, d):
    # catches: a sampler whose Gram matrix is not drawn from log_prob's p(S | Y) in the frame
    # of the sampled Y (P' = Y chol(S)^T R, S drawn for another cloud's Y, Sigma vs Sigma / nu)
    # S | Y ~ Wishart(nu, Sigma / nu) gives, with A = Sigma^-1 S (any representative),
    # E[tr A] = d and E[tr A^2] = d (nu + d + 1) / nu. The flow is switched off (gain 0; the
    # Grassmann part is checked above) and the Gram density made strongly anisotropic.
    model = make_model(n, d, gain=0.0, chunk_size=4096)
    calibrate_gram(model, dof=n + 2.0, w_spread=1.5, dof_spread=0.3)
    with torch.no_grad():
        P = model.sample(3000, torch.Generator().manual_seed(0))
        Y, S = model.factor(P)
        Sigma, nu = model.gram.params(Y)
    ev = torch.linalg.eigvalsh(Sigma)
    assert (ev[:, -1] / ev[:, 0]).median() > 2 and nu.std() > 0.5  # anisotropic, varying dof
    A = torch.linalg.solve(Sigma, S)
    f1 = torch.diagonal(A, dim1=-2, dim2=-1).sum(-1) - d
    f2 = torch.diagonal(A @ A, dim1=-2, dim2=-1).sum(-1) - d * (nu + d + 1) / nu
    for f in (f1, f2):
        tol = mc_tolerance(f)
        assert tol < 0.15 * d  # resolves a bias of 15% of E[tr A] = d
        assert abs(f.mean().item()) < tol


# ------------------------------------------ exact values, Haar rotation, n > d + 2 (quick)
def uniform_grassmann_part(model: TwoPartShapeFlow) -> None:
    """Replace the model's GrCNF density by the uniform one, -log V_Gr(d, n - 1) (computed
    here), so that a test of the Gram and Jacobian terms runs no ODE."""
    log_vol = log_volume_grassmann(model.dim, model.n_points - 1)
    model.flow.log_prob = lambda Y, exact=None: Y.new_full(Y.shape[:-2], -log_vol)


def wishart_ref(S: torch.Tensor, dof, V: torch.Tensor) -> torch.Tensor:
    """log Wishart(S; dof, V) by torch.distributions (independent of grassflow's)."""
    return torch.distributions.Wishart(torch.as_tensor(dof), covariance_matrix=V).log_prob(S)


@pytest.mark.parametrize("n,d", [(5, 2), (6, 3)])
def test_log_prob_of_the_isotropic_gaussian(n, d):
    # catches: the Jacobian with n instead of n - 1 rows, subtracted instead of added, or the
    # wrong sign of its log det S term (exponent (n - d - 2) / 2 != 0 here), and any constant
    # offset: with a zero field (uniform [Y]) and S | Y ~ Wishart(n - 1, s2 I), the TwoPartShapeFlow
    # is exactly the isotropic Gaussian N(0, s2 I) on the (n - 1) d Helmert coordinates
    s2 = 0.7
    model = make_model(n, d, gain=0.0)
    model.gram = WishartGram(n, d, hidden=8, log_scale=math.log((n - 1) * s2), dof=n - 1.0)
    P = torch.cat([math.sqrt(s2) * torch.randn(4, n, d), 2.0 * torch.randn(4, n, d)]) + 3.0
    with torch.no_grad():
        Sigma, nu = model.gram.params(model.factor(P)[0])
        lp = model.log_prob(P)
    torch.testing.assert_close(Sigma / nu[:, None, None], s2 * torch.eye(d).expand(8, d, d),
                               atol=1e-12, rtol=0)  # fmt: skip
    assert lp.std() > 1.0
    torch.testing.assert_close(lp, gaussian_log_prob(model.helmert(P), s2), atol=1e-9, rtol=0)


@pytest.mark.parametrize("n,d", [(5, 2), (6, 3)])
def test_log_prob_by_brute_force(n, d):
    # catches: S's eigenvalues paired with the wrong columns of Y (reversed order), the
    # Jacobian with n rows, subtracted, or with the wrong sign of log det S: each term
    # recomputed in another representative of the span (QR of P', rotated), the Gram term by
    # torch's Wishart and the Jacobian from the Gaussian identity
    # log N(P'; 0, I) = -log V_Gr + log Wishart(S; n - 1, I) + jacobian (any frame)
    model = make_model(n, d, field_rms=0.3)
    calibrate_gram(model, dof=n + 1.0, w_spread=1.5, dof_spread=0.3)  # anisotropic Sigma(Y)
    P = 1.5 * torch.randn(5, n, d) + 1.0
    Pp = helmert_basis(n).mT @ (P - P.mean(1, keepdim=True))
    Y = torch.linalg.qr(Pp)[0] @ torch.linalg.qr(torch.randn(5, d, d))[0]
    S = Y.mT @ Pp @ Pp.mT @ Y  # not diagonal: another frame than TwoPartShapeFlow's
    with torch.no_grad():
        lp = model.log_prob(P)
        log_gr = model.flow.log_prob(Y)
        Sigma, nu = model.gram.params(Y)
    ev = torch.linalg.eigvalsh(Sigma)
    assert (ev[:, -1] / ev[:, 0]).max() > 2  # so that the frame of S matters
    jac = (gaussian_log_prob(Pp, 1.0) + log_volume_grassmann(d, n - 1)
           - wishart_ref(S, n - 1.0, torch.eye(d)))  # fmt: skip
    ref = log_gr + wishart_ref(S, nu, Sigma / nu[:, None, None]) + jac
    assert (log_gr + log_volume_grassmann(d, n - 1)).abs().max() > 0.1  # the flow moves mass
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n,d", [(5, 2), (6, 3)])
def test_sample_given_is_haar_rotated(n, d):
    # catches: a sampler without the Haar rotation R (P' = Y chol(S)) or with rotations only
    # (no reflections): given Y, B = Y^T P' = chol(S) R must have E[B] = 0,
    # E[B^T B] = E[tr S] I / d and det B < 0 half of the time
    model = make_model(n, d)
    calibrate_gram(model, dof=n + 1.0, w_spread=1.0, dof_spread=0.3)
    m = 4000
    Y = Grassmann(d, n - 1).random(1).expand(m, -1, -1)
    with torch.no_grad():
        Pp = model.helmert(model.sample_given(Y, torch.Generator().manual_seed(0)))
    B = Y.mT @ Pp
    BtB = B.mT @ B
    scale = torch.diagonal(BtB, dim1=-2, dim2=-1).sum(-1).mean().item() / d
    stats = [B[:, i, j] / scale**0.5 for i in range(d) for j in range(d)]
    stats += [(BtB[:, i, j] - (i == j) * BtB[:, 0, 0]) / scale
              for i in range(d) for j in range(i, d) if (i, j) != (0, 0)]  # fmt: skip
    stats.append((torch.linalg.det(B) < 0).double() - 0.5)
    for x in stats:
        tol = mc_tolerance(x)
        assert tol < 0.1  # resolves a bias of 10% of the scale
        assert abs(x.mean().item()) < tol


@pytest.mark.parametrize("n,d", [(5, 2), (6, 3)])
def test_normalized_for_n_above_d_plus_2(n, d):
    # catches: a wrong log det S term (its sign, or n instead of n - 1 rows: the exponent
    # (n - d - 2) / 2 vanishes in the slow n = d + 2 cases), the Jacobian subtracted, or a Gram
    # density or sampler that is not normalized, to 1%: int p(P') dP' = E_q[p / q] = 1 and
    # E_{P ~ p}[q / p] = 1 with q = N(0, s2 I). The Grassmann part is uniform (computed here,
    # no ODE: the flow's own normalization is test_flows'), the Gram density depends on Y.
    model = make_model(n, d, gain=0.0)
    calibrate_gram(model, dof=n - 1.0, w_spread=0.1, dof_spread=0.03)
    uniform_grassmann_part(model)
    s2, m = 1.0 / (n - 1), 20000
    gen = torch.Generator().manual_seed(1)
    Pp = math.sqrt(s2) * torch.randn(m, n - 1, d, generator=gen)
    with torch.no_grad():
        Y = Grassmann(d, n - 1).random(m, generator=gen)
        samples = model.sample_given(Y, gen)
        weights = {
            "p/q": torch.exp(model.log_prob(helmert_basis(n) @ Pp) - gaussian_log_prob(Pp, s2)),
            "q/p": torch.exp(gaussian_log_prob(model.helmert(samples), s2)
                             - model.log_prob(samples)),
        }  # fmt: skip
        Sigma, nu = assert_finite_variance(model, model.factor(helmert_basis(n) @ Pp)[0],
                                           s2, "p/q")  # fmt: skip
        assert_finite_variance(model, Y, s2, "q/p")
    assert nu.std() > 0.02 and Sigma.std(0).max() > 0.02  # the Gram density depends on Y
    for name, w in weights.items():
        tol = mc_tolerance(w)
        assert tol < 0.006, name  # power: a 1% error in p is > tol + 2.5 standard errors off
        assert abs(w.mean().item() - 1.0) < tol, name


# ------------------------------------------------------------------ invariances, sampling
@pytest.mark.parametrize("n,d", [(4, 2), (5, 3)])
def test_log_prob_invariances(n, d):
    # catches: no centring, a representative-dependent Grassmann or Gram term, or a network
    # that is not permutation invariant
    model = make_model(n, d)
    P = 2.0 * torch.randn(6, n, d) + 5.0
    with torch.no_grad():
        lp = model.log_prob(P)
        assert lp.std() > 0.1 and torch.isfinite(lp).all()
        moved = {
            "translation": P + torch.randn(6, 1, d),
            "rotation": P @ random_orthogonal(d, reflect=False),
            "reflection": P @ random_orthogonal(d, reflect=True),
            "permutation": P[:, torch.randperm(n)],
            "per-cloud O(d)": P @ torch.linalg.qr(torch.randn(6, d, d))[0],
        }
        for name, P2 in moved.items():
            torch.testing.assert_close(model.log_prob(P2), lp, atol=1e-6, rtol=0, msg=name)


def test_labels_restrict_permutation_invariance():
    # catches: labels that do not reach the model, or break label-preserving symmetry
    n, d = 5, 2
    model = make_model(n, d, labels=torch.tensor([0, 0, 1, 1, 1]))
    P = torch.randn(6, n, d)
    with torch.no_grad():
        lp = model.log_prob(P)
        for perm in ([1, 0, 2, 3, 4], [0, 1, 4, 2, 3]):
            torch.testing.assert_close(model.log_prob(P[:, perm]), lp, atol=1e-6, rtol=0)
        assert (model.log_prob(P[:, [2, 1, 0, 3, 4]]) - lp).abs().max() > 1e-3


@pytest.mark.parametrize("n,d", [(4, 2), (5, 3)])
def test_sample_shape_centring_and_reproducibility(n, d):
    # catches: samples that are not centred, the wrong (n, d) layout, or a part of the
    # sampler (flow prior, Wishart, Haar rotation) drawing from the global RNG
    model = make_model(n, d)
    torch.manual_seed(1)
    a = model.sample(7, torch.Generator().manual_seed(3))
    torch.manual_seed(2)
    b = model.sample(7, torch.Generator().manual_seed(3))
    c = model.sample(7, torch.Generator().manual_seed(4))
    assert a.shape == (7, n, d) and a.dtype == torch.float64
    torch.testing.assert_close(a.mean(dim=1), torch.zeros(7, d), atol=1e-12, rtol=0)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert (a - c).abs().max() > 1e-3
    # several chunks (chunk_size 3) give the same layout, and log_prob accepts the samples
    model.chunk_size = 3
    d_ = model.sample(7, torch.Generator().manual_seed(3))
    assert d_.shape == (7, n, d)
    torch.testing.assert_close(d_.mean(dim=1), torch.zeros(7, d), atol=1e-12, rtol=0)
    with torch.no_grad():
        assert torch.isfinite(model.log_prob(d_)).all()
    with pytest.raises(ValueError):
        model.sample(0)


# ------------------------------------------------------------------ terms and validation
@pytest.mark.slow
@pytest.mark.parametrize("n,d", [(4, 2), (5, 2), (6, 3), (7, 2)])
def test_log_prob_terms(n, d):
    # catches: terms that do not add up, the Jacobian computed with n instead of n - 1 rows
    # (the exponent (n - d - 2) / 2 of det S), or the Gram term evaluated at another frame
    model = make_model(n, d)
    P = torch.randn(5, n, d) + 3.0
    with torch.no_grad():
        terms = model.log_prob_terms(P)
        Y, S = model.factor(P)
        flow_lp = model.flow.log_prob(Y)
        gram_lp = model.gram.log_prob(S, Y)
    torch.testing.assert_close(terms["log_prob"],
                               terms["grassmann"] + terms["gram"] + terms["jacobian"],
                               atol=1e-12, rtol=0)  # fmt: skip
    torch.testing.assert_close(model.log_prob(P), terms["log_prob"], atol=1e-12, rtol=0)
    torch.testing.assert_close(terms["grassmann"], flow_lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(terms["gram"], gram_lp, atol=1e-12, rtol=0)
    # in chunks of 2 clouds the terms stay with their clouds (to the solver's tolerance)
    model.chunk_size = 2
    with torch.no_grad():
        chunked = model.log_prob_terms(P)
    torch.testing.assert_close(chunked["grassmann"], flow_lp, atol=1e-5, rtol=0)
    # factor: Y orthonormal spanning P', S = Y^T P' P'^T Y with the eigenvalues of P'^T P'
    Pp = helmert_basis(n).mT @ (P - P.mean(1, keepdim=True))
    torch.testing.assert_close(model.helmert(P), Pp, atol=1e-12, rtol=0)
    torch.testing.assert_close(Y.mT @ Y, torch.eye(d).expand(5, d, d), atol=1e-12, rtol=0)
    torch.testing.assert_close(Y @ (Y.mT @ Pp), Pp, atol=1e-12, rtol=0)
    torch.testing.assert_close(S, Y.mT @ Pp @ Pp.mT @ Y, atol=1e-11, rtol=0)
    torch.testing.assert_close(torch.linalg.eigvalsh(S), torch.linalg.eigvalsh(Pp.mT @ Pp),
                               atol=1e-11, rtol=0)  # fmt: skip
    # Jacobian, independently: for P' ~ N(0, I), [Y] is uniform and S | Y ~ Wishart(n - 1, I),
    # so jacobian = log N(P') + log V_Gr(d, n - 1) - log Wishart(S; n - 1, I)
    wishart = torch.distributions.Wishart(torch.tensor(n - 1.0), torch.eye(d))
    ref = gaussian_log_prob(Pp, 1.0) + log_volume_grassmann(d, n - 1) - wishart.log_prob(S)
    torch.testing.assert_close(terms["jacobian"], ref, atol=1e-10, rtol=0)
    # the flow's volume convention is the V_Gr used above
    assert abs(model.manifold.log_volume() - log_volume_grassmann(d, n - 1)) < 1e-12


def test_gradients_reach_every_parameter():
    # catches: a part of the model (flow, T, Gram heads) detached from the likelihood
    model = make_model(4, 2).train()
    model.log_prob(torch.randn(3, 4, 2)).sum().backward()
    for name, p in model.named_parameters():
        if name == "flow.field.potential.out.bias":
            continue  # a constant added to the potential does not change its gradient field
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        # the Gram network runs at t = 0: its weights on t (gate.weight, bias.weight of each
        # ConcatSquash) multiply zero and get no gradient
        if not (name.startswith("gram.") and name.endswith(("gate.weight", "bias.weight"))):
            assert p.grad.abs().max() > 0, name


def test_bad_input_raises():
    # catches: silently wrong densities for malformed clouds
    model = make_model(4, 2)
    bad = {
        "too many points": torch.randn(3, 5, 2),
        "wrong dimension": torch.randn(3, 4, 3),
        "no batch": torch.randn(4, 2),
        "extra batch": torch.randn(2, 3, 4, 2),
        "empty": torch.randn(0, 4, 2),
        "float32": torch.randn(3, 4, 2, dtype=torch.float32),
        "nan": torch.randn(3, 4, 2).index_put_((torch.tensor(1), torch.tensor(2),
                                                torch.tensor(0)), torch.tensor(math.nan)),
        "inf": torch.randn(3, 4, 2).index_put_((torch.tensor(0), torch.tensor(0),
                                                torch.tensor(1)), torch.tensor(math.inf)),
        # all four points on a line: P' has rank 1 < 2
        "collinear": torch.stack([torch.randn(4, 1) * torch.tensor([1.0, 2.0]) + 1.0,
                                  torch.randn(4, 2)]),
    }  # fmt: skip
    for name, P in bad.items():
        with pytest.raises(ValueError):
            model.log_prob(P)
            pytest.fail(name)
    with pytest.raises(ValueError):
        model.log_prob(torch.randn(3, 4, 2).tolist())
    # coplanar points in 3-D
    model3 = make_model(5, 3)
    flat = torch.cat([torch.randn(2, 5, 2), torch.zeros(2, 5, 1)], dim=-1)
    with pytest.raises(ValueError):
        model3.log_prob(flat @ random_orthogonal(3))
    # n < d + 2: no density on centred clouds (Gr(d, n - 1) is a point or undefined)
    for n, d in [(3, 2), (4, 3), (2, 1), (4, 0)]:
        with pytest.raises(ValueError):
            TwoPartShapeFlow(n, d)
    with pytest.raises(ValueError):
        TwoPartShapeFlow(5, 2, "transformer")


# ------------------------------------------------------------------ the MLP potential
@pytest.mark.parametrize("potential,prior", [("mlp", "uniform"), ("graph", "gaussian")])
def test_non_invariant_options_are_not_permutation_invariant(potential, prior):
    # documents: the paper's MLP potential and the Cayley-Gaussian prior see the points in
    # Helmert order, so relabelling changes log p; they keep O(d) and translation invariance
    # catches: a silently ignored potential / prior option
    n, d = 5, 2
    kwargs = {"field": potential, "prior": prior}
    if potential == "mlp":
        kwargs["widths"] = (16, 16)
    model = make_model(n, d, **kwargs)
    P = torch.randn(6, n, d)
    with torch.no_grad():
        lp = model.log_prob(P)
        assert torch.isfinite(lp).all()
        torch.testing.assert_close(model.log_prob(P @ random_orthogonal(d) - 1.0), lp,
                                   atol=1e-6, rtol=0)  # fmt: skip
        assert (model.log_prob(P[:, [1, 2, 3, 4, 0]]) - lp).abs().max() > 1e-2
        S = model.sample(3, torch.Generator().manual_seed(0))
    assert S.shape == (3, n, d)
    torch.testing.assert_close(S.mean(1), torch.zeros(3, d), atol=1e-12, rtol=0)


def test_gram_density_is_wishart_of_the_model():
    # catches: TwoPartShapeFlow's Gram term using another parametrization than WishartGram.params
    model = make_model(5, 2)
    P = torch.randn(4, 5, 2)
    with torch.no_grad():
        Y, S = model.factor(P)
        Sigma, nu = model.gram.params(Y)
        ref = wishart_log_prob(S, nu, Sigma / nu[:, None, None])
        torch.testing.assert_close(model.log_prob_terms(P)["gram"], ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n,d", [(4, 2), (5, 3)])
def test_sample_given_keeps_the_spans(n, d):
    # catches: sample_given ignoring the given spans (drawing its own), or an orientation or
    # Cholesky factor applied on the wrong side (which would move the span)
    model = make_model(n, d)
    P = 2.0 * torch.randn(9, n, d, generator=torch.Generator().manual_seed(0))
    Y, _ = model.factor(P)
    X = model.sample_given(Y, torch.Generator().manual_seed(1))
    Y2, _ = model.factor(X)
    torch.testing.assert_close(Y2 @ Y2.mT, Y @ Y.mT, atol=1e-10, rtol=0)
    torch.testing.assert_close(X.mean(dim=1), torch.zeros(9, d), atol=1e-12, rtol=0)
    assert not torch.allclose(model.factor(X)[1], model.factor(P)[1])  # S is drawn, not copied


@pytest.mark.parametrize("n,d", [(4, 2), (6, 3)])
def test_sample_given_with_the_clouds_own_gram_rebuilds_them(n, d):
    # catches: a given S used in another frame than factor's (e.g. transposed Cholesky factor
    # or S taken as a covariance of the whitened points), or S drawn although one was given:
    # factor's (Y, S) must rebuild each centred cloud up to a rotation, so all pair
    # distances agree
    model = make_model(n, d)
    P = 2.0 * torch.randn(7, n, d, generator=torch.Generator().manual_seed(3))
    Y, S = model.factor(P)
    X = model.sample_given(Y, torch.Generator().manual_seed(1), S=S)
    torch.testing.assert_close(torch.cdist(X, X), torch.cdist(P, P), atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="S must have shape"):
        model.sample_given(Y, S=S[:3])
