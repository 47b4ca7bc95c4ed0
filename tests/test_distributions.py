import itertools
import math

import pytest
import torch

from conftest import random_orthogonal
from grassflow.distributions import MatrixGaussianPrior, UniformGrassmann
from grassflow.manifolds import Grassmann, orthonormality_error


def make_prior(k, D, sigma, anisotropic=False, mean=None):
    gr = Grassmann(k, D)
    M = gr.random() if mean is None else mean
    U, V = sigma**2 * torch.eye(D), torch.eye(k)
    if anisotropic:
        A, B = torch.randn(D, D), torch.randn(k, k)
        U = U + 0.3 * sigma**2 * A @ A.T / D
        V = V + 0.2 * B @ B.T / k
    return gr, MatrixGaussianPrior(gr, mean=M, row_cov=U, col_cov=V)


CASES = [(1, 3), (2, 4), (2, 3), (3, 5)]


def free_angle_cutoff(M, Y, eps=1e-6):
    """A smooth ``phi(Y)`` in [0, 1] that vanishes on the prior's singular set, ``(...)``.

    With ``c_i = sin^2`` of the r = min(k, D - k) free principal angles from [M] to [Y] (one
    minus the r smallest eigenvalues of ``M^T Y Y^T M``; the other k - r angles are 0),
    ``rho = prod_{i<j} ((c_i - c_j) / (c_i + c_j))^2`` and ``phi = rho / (rho + eps)``. rho is
    zero where two free angles coincide and are positive (which includes the farthest
    subspace), scale-free near M, and phi = 1 when r = 1. Near the set, phi vanishes like the
    squared gap while the density grows like one over it, so ``phi * p`` is bounded.
    """
    D, k = M.shape
    r = min(k, D - k)
    if r < 2:
        return Y.new_ones(Y.shape[:-2])
    c = 1 - torch.linalg.eigvalsh(M.mT @ Y @ Y.mT @ M)[..., :r]
    i, j = torch.triu_indices(r, r, offset=1)
    rho = ((c[..., i] - c[..., j]) / (c[..., i] + c[..., j]).clamp_min(1e-300)).square().prod(-1)
    return rho / (rho + eps)


def with_angles(M, theta):
    """Points ``(..., D, k)`` at principal angles ``theta: (..., k)`` from [M], one random frame.

    ``X = M A cos(theta) + M_perp B sin(theta)`` with A in O(k) and B's last r columns
    orthonormal in the complement (the first k - r angles must be 0 when 2k > D).
    """
    D, k = M.shape
    r = min(k, D - k)
    M_perp = torch.linalg.qr(torch.cat([M, torch.randn(D, D)], -1))[0][:, k:D]
    B = torch.zeros(D - k, k)
    B[:, k - r :] = random_orthogonal(D - k)[:, :r]
    cos, sin = torch.cos(theta).unsqueeze(-2), torch.sin(theta).unsqueeze(-2)
    return (M @ random_orthogonal(k)) * cos + (M_perp @ B) * sin


def isotropic_log_prob(theta, D):
    """Closed form of log p for U = I, V = I at principal angles ``theta: (k,)`` (floats).

    Sum over the 2^r sign patterns of the free angles of N(s) / J(s), with s_i = 2 tan(t/2)
    or -2 cot(t/2) (0 for forced angles) and J = prod (1 + s_i^2/4)^-(D-1) prod_{i<j}
    |1 - s_i^2 s_j^2 / 16| (the docstring's formula, here evaluated one term at a time).
    """
    k = len(theta)
    r = min(k, D - k)
    terms = []
    for flips in itertools.product([False, True], repeat=r):
        free = zip(theta[k - r :], flips)
        s = [0.0] * (k - r) + [-2 / math.tan(t / 2) if f else 2 * math.tan(t / 2) for t, f in free]
        log_n = -0.5 * k * (D - k) * math.log(2 * math.pi) - 0.5 * sum(x * x for x in s)
        log_j = -(D - 1) * sum(math.log1p(x * x / 4) for x in s) + sum(
            math.log(abs(1 - s[a] ** 2 * s[b] ** 2 / 16)) for a in range(k) for b in range(a + 1, k)
        )
        terms.append(log_n - log_j)
    return torch.logsumexp(torch.tensor(terms), 0).item()


@pytest.mark.slow
@pytest.mark.parametrize("k,D", CASES)
@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_prior_integrates_to_one(k, D, sigma):
    # catches a dropped or extra Cayley preimage, a wrong Jacobian exponent or pair factor, and
    # a wrong normalizing constant.
    # int p = V_Gr E_uniform[p phi] + E_prior[1 - phi]. Plain V_Gr E_uniform[p] would have
    # infinite variance for r >= 2 (p ~ 1/gap near equal principal angles, see the class
    # docstring), so a tolerance from its sample SD is no bound. phi (free_angle_cutoff) vanishes
    # there: the first weights are bounded; the second term, in [0, 1], lets the sampler
    # stand in for the thin neighbourhood of the singular set. For r = 1, phi = 1 and p is
    # bounded, so the estimate is plain importance sampling from the uniform law.
    gr, prior = make_prior(k, D, sigma, anisotropic=True)
    U = gr.random(200_000)
    a = torch.exp(prior.log_prob(U) + gr.log_volume()) * free_angle_cutoff(prior.loc, U)
    b = 1 - free_angle_cutoff(prior.loc, prior.sample((20_000,)))
    se = math.hypot(a.std().item() / len(a) ** 0.5, b.std().item() / len(b) ** 0.5)
    assert b.mean().item() < 0.01  # the sampler stands in for under 1% of the mass
    # the check has power: 4 SE < 0.016, while (measured) dropping preimage 1 moves the
    # integral by >= 0.038 at sigma = 1 (the doubly flipped one of Gr(2, 4) by 0.009, 4.6 SE),
    # log p + 0.03 by 0.03, exponent D instead of D - 1 by >= 0.14, no pair factor by >= 0.10
    assert se < 0.004
    assert (a.mean() + b.mean()).item() == pytest.approx(1.0, abs=4 * se)


@pytest.mark.parametrize("k,D", CASES)
def test_prior_density_matches_its_sampler(k, D):
    # catches a sampler that is not Algorithm 1 (e.g. one that ignores col_cov) and a density
    # that is not the sampler's law (wrong Jacobian or pair factor, wrong constant).
    # E_samples[f] == V_Gr * E_uniform[f p] for a bounded test function f = c^T Y Y^T c * phi,
    # phi = free_angle_cutoff vanishing on the singular set so that f p is bounded (finite
    # variance) for r >= 2 too
    gr, prior = make_prior(k, D, 0.6, anisotropic=True)
    c = torch.randn(D)
    c = c / c.norm()

    def f(Y):
        return ((c[:, None] * Y).sum(-2) ** 2).sum(-1) * free_angle_cutoff(prior.loc, Y)

    fs = f(prior.sample((50_000,)))
    U = gr.random(200_000)
    fw = f(U) * torch.exp(prior.log_prob(U) + gr.log_volume())
    se = math.hypot(fs.std().item() / len(fs) ** 0.5, fw.std().item() / len(fw) ** 0.5)
    # the check has power: 4 SE < 0.01, while (measured) log p + 0.03 moves the difference
    # by >= 0.012, a sampler that ignores col_cov by 0.007-0.019, no pair factor by >= 0.011
    assert se < 0.0025
    assert fs.mean().item() == pytest.approx(fw.mean().item(), abs=4 * se)


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


@pytest.mark.parametrize("k,D", CASES)
def test_prior_at_the_mean_a_generic_and_the_farthest_subspace(k, D):
    # catches a mode off by the Jacobian or normalization (mean), a wrong enumeration or pairing
    # of the Cayley preimages (generic point), and a farthest subspace reported as an ordinary
    # value although the density is singular there for r >= 2
    gr = Grassmann(k, D)
    r = min(k, D - k)
    M = gr.random()
    # sigma = 1, so that every preimage counts
    prior = MatrixGaussianPrior(gr, M, torch.eye(D), torch.eye(k))
    # one subspace, three representatives: the mode, N_h(0) times Jacobian 1
    lp = prior.log_prob(torch.stack([M, -M, M @ random_orthogonal(k)]))
    mode = -0.5 * k * (D - k) * math.log(2 * math.pi)
    assert torch.allclose(lp, torch.full((3,), mode), rtol=0, atol=1e-12)
    # a subspace at distinct free angles: the closed form over all 2^r preimages
    theta = [0.0] * (k - r) + [0.4, 1.1][-r:]
    X = with_angles(M, torch.tensor(theta))
    assert prior.log_prob(X).item() == pytest.approx(isotropic_log_prob(theta, D), abs=1e-10)
    # the farthest subspace, all free angles pi/2
    far = [0.0] * (k - r) + [math.pi / 2] * r
    X_far = with_angles(M, torch.tensor(far))
    # three different subspaces: at distance 0, |theta| and (pi/2) sqrt(r) from [M]
    assert gr.dist(M, torch.stack([X, X_far])).tolist() == pytest.approx(
        [math.hypot(*theta), math.pi / 2 * r**0.5], abs=1e-7
    )
    lp_far = prior.log_prob(X_far).item()
    if r == 1:  # two preimages with |s| = 2: finite
        assert lp_far == pytest.approx(isotropic_log_prob(far, D), abs=1e-10)
    else:  # equal angles: p = +inf; rounding may leave a finite value, never a small one
        near = torch.tensor(far) - 1e-6 * torch.arange(k, 0, -1) * (torch.tensor(far) > 0)
        assert not math.isnan(lp_far)
        assert lp_far > prior.log_prob(with_angles(M, near)).item() > mode + 5


@pytest.mark.parametrize("k,D", [(2, 4), (3, 5)])
@pytest.mark.parametrize("path", ["tie", "farthest"])
def test_prior_density_near_equal_principal_angles(k, D, path):
    # catches a dropped, squared, square-rooted or clamped pair factor |1 - s_i^2 s_j^2 / 16|,
    # and (path "tie") a density from the principal preimage only: along a path where two free
    # angles meet (at 1.2 rad, or both at pi/2), p must grow exactly like 1 / gap, i.e.
    # log p + log(gap) converges, with first-order corrections
    gr, prior = make_prior(k, D, 1.0, anisotropic=True)
    gaps = 10.0 ** -torch.arange(2.0, 9.0)  # 1e-2 ... 1e-8, float64
    theta = torch.zeros(len(gaps), k)
    top = 1.2 if path == "tie" else math.pi / 2
    theta[:, -1] = top - (0 if path == "tie" else gaps)
    theta[:, -2] = theta[:, -1] - gaps
    lp = prior.log_prob(with_angles(prior.loc, theta))
    assert torch.isfinite(lp).all()
    assert lp[-1] - lp[0] > math.log(1e5)  # unbounded
    f = lp + gaps.log()
    assert ((f[1:] - f[:-1]).abs() < 10 * gaps[:-1]).all()


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


def aligned(D, k, theta):
    """Points ``(..., D, k)`` with ``I_{D,k}^T Y = diag(cos theta)`` exactly, ``theta: (..., k)``.

    Column i is e_i for the k - r forced angles (theta_i = 0) and
    ``cos(theta_i) e_i + sin(theta_i) e_{k+j}`` for the j-th free one, so equal angles give
    bit-for-bit equal singular values of ``M^T Y`` for the prior mean ``M = I_{D,k}``
    (TwoPartShapeFlow's).
    """
    r = min(k, D - k)
    Y = torch.zeros(*theta.shape[:-1], D, k)
    i = torch.arange(k)
    Y[..., i, i] = torch.cos(theta)
    Y[..., k + i[:r], i[k - r :]] = torch.sin(theta[..., k - r :])
    return Y


def horizontal_derivatives(prior, Y, h=1e-4):
    """Derivatives of log p at ``Y: (n, D, k)`` along random horizontal E, each ``(n,)``.

    Returns autograd's ``<grad, E>``, the fourth-order central difference (error ~ h^4 f^(5)
    + eps |f| / h, about 1e-12 relative) along the retraction ``Y -> qr(Y + t E)`` (to first
    order the move along E; log p ignores the representative), and the gradient itself.
    """
    Y = Y.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(prior.log_prob(Y).sum(), Y)
    E = prior.manifold.proju(Y.detach(), torch.randn_like(Y))

    def f(t):
        return prior.log_prob(torch.linalg.qr(Y.detach() + t * E)[0])

    fd = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
    return (grad * E).sum((-2, -1)), fd, grad


@pytest.mark.parametrize("k,D", [(3, 4), (2, 3), (3, 13), (2, 4), (1, 2)])
def test_prior_log_prob_gradient_matches_finite_differences(k, D):
    # catches NaN gradients from autograd through the SVD M^T Y = A cos(theta) B^T, which divides
    # by c_i - c_j: on Gr(3, 4) any two 3-planes share a plane, so cos theta = 1 is a double
    # singular value at every point (the reported ShapeFlow(5, 3) failure; bit-equal here for the
    # aligned points, by chance for others). Gr(2, 3), Gr(3, 13), Gr(2, 4) and Gr(1, 2) have no
    # forced repeat: with Gr(3, 4) they catch a wrong closed-form derivative of the preimages
    # (e.g. a dropped or mis-signed divided difference, or s differentiated wrongly).
    r = min(k, D - k)
    gr, prior = make_prior(k, D, 0.5, anisotropic=True, mean=torch.eye(D, k))
    theta = torch.zeros(4, k)
    theta[:, k - r :] = torch.sort(0.2 + 1.2 * torch.rand(4, r), -1).values
    Y = torch.cat([prior.sample((8,)), gr.random(8), aligned(D, k, theta)])
    an, fd, grad = horizontal_derivatives(prior, Y)
    assert torch.isfinite(grad).all()
    assert an.abs().max() > 0.1  # the check has power
    torch.testing.assert_close(an, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("k,D", [(3, 4), (2, 4), (3, 13), (1, 2)])
def test_prior_log_prob_gradient_at_and_near_the_mean(k, D):
    # catches NaN at [Y] = [M], where cos theta = 1 is a k-fold singular value of M^T Y (for
    # every k >= 2), and a gradient that is finite but wrong at tiny angles: log p is smooth
    # through its mode, with zero gradient there, and the first-order derivative at angles
    # down to 3e-9 must match finite differences
    r = min(k, D - k)
    gr, prior = make_prior(k, D, 0.5, anisotropic=True, mean=torch.eye(D, k))
    M = prior.loc
    an, fd, grad = horizontal_derivatives(prior, torch.stack([M, M @ random_orthogonal(k)]))
    assert torch.isfinite(grad).all()
    assert gr.proju(M, grad).abs().max() < 1e-12
    theta = torch.zeros(6, k)
    theta[:, k - r :] = torch.tensor([1e-2, 1e-4, 1e-6, 1e-7, 1e-8, 3e-9])[:, None]
    theta[:, k - r :] *= torch.linspace(1.0, 2.0, r)
    Y = torch.cat([aligned(D, k, theta), with_angles(M, theta)])
    an, fd, grad = horizontal_derivatives(prior, Y)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(an, fd, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("k,D", [(2, 4), (4, 6)])
def test_prior_gradient_at_tied_positive_angles(k, D):
    # catches a backward that still divides by c_i - c_j for a tie between two positive angles
    # (autograd's SVD backward, or a fix that only handles the ties at angle 0). A tie is the
    # singular set, through the preimages that put the two angles on different branches; the
    # principal one is smooth there, and so must its term of the density be (compared with
    # finite differences below). log p itself is +inf or, by rounding in the pair factor, a
    # large finite value there (class docstring); where it is finite, its gradient must be too.
    # Ties are exact here; float32 rounding makes near-ties exact in practice.
    r = min(k, D - k)
    gr, prior = make_prior(k, D, 0.3, anisotropic=True, mean=torch.eye(D, k))
    theta = torch.zeros(5, k)
    theta[:, k - r :] = torch.tensor([0.3, 0.5, 0.8, 1.0, 1.3])[:, None]
    Y = aligned(D, k, theta)

    class Principal:  # the principal preimage's term of log p, same interface as the prior
        manifold = gr

        def log_prob(self, Y):
            xi, s, _ = gr.cayley_preimages(prior.loc.expand_as(Y), Y)
            return prior.horizontal_log_prob(xi[0]) - Grassmann.cayley_log_jacobian(s[0], D)

    an, fd, grad = horizontal_derivatives(Principal(), Y)
    assert torch.isfinite(grad).all()
    assert an.abs().max() > 0.1  # the check has power
    torch.testing.assert_close(an, fd, rtol=1e-6, atol=1e-8)
    Y.requires_grad_(True)
    lp = prior.log_prob(Y)
    (grad,) = torch.autograd.grad(lp.sum(), Y)
    assert torch.isfinite(grad[torch.isfinite(lp)]).all()


def test_shape_flow_gaussian_prior_gradients_are_finite():
    # the reported failure: ShapeFlow(5, 3) is a flow on Gr(3, 4) (two principal angles always
    # 0), and autograd through the prior's SVD returned NaN for Y and for every parameter
    from grassflow_paper.two_part import TwoPartShapeFlow

    torch.manual_seed(0)
    m = TwoPartShapeFlow(5, 3, "mlp", prior="gaussian").double()
    Y, _ = m.factor(torch.randn(8, 5, 3, dtype=torch.float64))
    Y = Y.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(m.flow.prior().log_prob_unchecked(Y).sum(), Y)
    assert torch.isfinite(grad).all()
    lp = m.flow.log_prob(Y.detach())
    lp.sum().backward()
    assert torch.isfinite(lp).all()
    for name, p in m.flow.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


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
