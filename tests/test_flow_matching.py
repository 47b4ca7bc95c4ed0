import math

import pytest
import torch

from conftest import random_orthogonal
from grassflow import Grassmann, GrCNF, MatrixGaussianPrior
from grassflow.manifolds import orthonormality_error
from grassflow.training import flow_matching_objective
from grassflow.training.flow_matching import flow_matching_losses

CASES = [(1, 3), (2, 4), (3, 13), (3, 4)]


@pytest.mark.parametrize("k,D", CASES)
def test_geodesic_endpoints_speed_and_orthonormality(k, D):
    gr = Grassmann(k, D)
    Y0, Y1 = gr.random(6), gr.random(6)
    assert torch.allclose(gr.geodesic(Y0, Y1, torch.zeros(6))[0], Y0, atol=1e-12)
    assert gr.same_subspace(gr.geodesic(Y0, Y1, torch.ones(6))[0], Y1, atol=1e-10).all()
    Yt, ut = gr.geodesic(Y0, Y1, torch.rand(6))
    assert orthonormality_error(Yt).max() < 1e-12
    assert (Yt.mT @ ut).abs().max() < 1e-12  # horizontal at Y_t
    # constant speed equal to the geodesic distance
    assert torch.allclose(gr.norm(Yt, ut), gr.dist(Y0, Y1), atol=1e-10)


@pytest.mark.parametrize("k,D", CASES)
def test_velocity_is_the_time_derivative(k, D):
    gr = Grassmann(k, D)
    Y0, Y1, t = gr.random(6), gr.random(6), 0.05 + 0.9 * torch.rand(6)
    h = 1e-6
    fd = (gr.geodesic(Y0, Y1, t + h)[0] - gr.geodesic(Y0, Y1, t - h)[0]) / (2 * h)
    assert torch.allclose(gr.geodesic(Y0, Y1, t)[1], fd, atol=1e-8)


@pytest.mark.parametrize("k,D", CASES)
def test_geodesic_transforms_with_the_representatives(k, D):
    gr = Grassmann(k, D)
    Y0, Y1, t = gr.random(6), gr.random(6), torch.rand(6)
    Q0, Q1 = random_orthogonal(k), random_orthogonal(k, reflect=False)
    Yt, ut = gr.geodesic(Y0, Y1, t)
    Yq, uq = gr.geodesic(Y0 @ Q0, Y1 @ Q1, t)
    assert torch.allclose(Yq, Yt @ Q0, atol=1e-10)
    assert torch.allclose(uq, ut @ Q0, atol=1e-10)


def test_geodesic_is_finite_at_the_cut_locus_and_at_zero_distance():
    gr = Grassmann(1, 3)
    y0 = torch.tensor([[[1.0], [0.0], [0.0]]])
    y1 = torch.tensor([[[0.0], [1.0], [0.0]]])  # angle pi/2
    Yt, ut = gr.geodesic(y0, y1, torch.tensor([0.5]))
    assert torch.isfinite(Yt).all() and torch.isfinite(ut).all()
    assert gr.norm(Yt, ut).item() == pytest.approx(math.pi / 2)
    Yt, ut = gr.geodesic(y0, y0, torch.tensor([0.3]))
    assert torch.allclose(Yt, y0) and ut.abs().max() == 0


def orthogonal_batch(n, k):
    """``(n, k, k)`` random elements of O(k), rotations and reflections alternating."""
    Q = torch.linalg.qr(torch.randn(n, k, k))[0]
    flip = torch.where(torch.det(Q) > 0, 1.0, -1.0) * (-1.0) ** torch.arange(n)
    Q = torch.cat([Q[..., :1] * flip[:, None, None], Q[..., 1:]], dim=-1)
    assert ((torch.det(Q) > 0) == (torch.arange(n) % 2 == 0)).all()
    return Q


def _fm_loss(model, Y, coupling, seed=7):
    """The library objective on ``Y`` with the global RNG (prior points, times) at ``seed``."""
    torch.manual_seed(seed)
    return flow_matching_objective(model, Y, coupling=coupling)[0]


def assert_loss_is_invariant(model, Y, gr):
    # catches a target or OT cost that depends on the representative of [Y] (e.g. a log map
    # by inv_retr or a Frobenius distance ||Y0 - Y1||), or a field that is not equivariant
    Q = orthogonal_batch(Y.shape[0], gr.k)
    for coupling in ("independent", "ot"):
        a, b = _fm_loss(model, Y, coupling), _fm_loss(model, Y @ Q, coupling)
        torch.testing.assert_close(a, b, rtol=1e-10, atol=0)
    # per pair, for both endpoints' representatives and the same times
    Y0, s = gr.random(Y.shape[0]), torch.rand(Y.shape[0])
    Q0 = orthogonal_batch(Y.shape[0], gr.k)
    per_pair = flow_matching_losses(model, Y0, Y, s)
    torch.testing.assert_close(flow_matching_losses(model, Y0 @ Q0, Y @ Q, s), per_pair,
                               rtol=1e-10, atol=1e-12)  # fmt: skip
    return per_pair


def test_flow_matching_loss_is_equivariant_and_decreases():
    torch.manual_seed(0)
    gr = Grassmann(2, 4)
    target = MatrixGaussianPrior(gr, gr.random(), 0.05 * torch.eye(4), torch.eye(2))
    model = GrCNF(gr, prior="uniform", train_T=False)
    assert_loss_is_invariant(model, target.sample((64,)), gr)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss, stats = flow_matching_objective(model, target.sample((128,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert stats == {"nfe": 0}
    assert sum(losses[-20:]) / 20 < 0.8 * sum(losses[:20]) / 20
    assert_loss_is_invariant(model, target.sample((64,)), gr)  # and for the trained field


class RotationField(torch.nn.Module):
    """``X(t, Y) = t Omega Y`` on Gr(1, 3), Omega the rotation generator about the z axis.

    Horizontal (``y^T Omega y = 0``) and equivariant (odd in y). Along the great circle
    ``y_s = (cos s theta, sin s theta, 0)`` it is ``t`` times the unit tangent.
    """

    def __init__(self):
        super().__init__()
        self.register_buffer("omega", torch.tensor([[0.0, -1, 0], [1, 0, 0], [0, 0, 0]]))

    def forward(self, t, Y):
        return t.reshape(*t.shape, 1, 1) * (self.omega @ Y)


def rotation_flow(T):
    return GrCNF(Grassmann(1, 3), RotationField(), prior="gaussian", T=T, train_T=True,
                 prior_mean=torch.eye(3)[:, :1], sigma=1e-6)  # fmt: skip


@pytest.mark.parametrize("T", [2.0, 0.7])
def test_flow_matching_uses_the_learned_end_time(T):
    # catches field(s, Y) in place of field(s T, Y) (or a missing / detached factor T): with
    # T != 1 the model's velocity dY/ds = T X(sT, Y) is no longer the one regressed
    theta = 0.6
    s = torch.tensor([0.1, 0.35, 0.8, 0.95])
    Y0 = torch.tensor([1.0, 0, 0]).expand(4, 3).unsqueeze(-1)
    Y1 = torch.tensor([math.cos(theta), math.sin(theta), 0]).expand(4, 3).unsqueeze(-1)
    model = rotation_flow(T)
    assert model.sqrt_T.requires_grad
    # along the geodesic u_s = theta * unit tangent and T X(sT, y_s) = T^2 s * unit tangent
    expected = (T**2 * s - theta) ** 2
    losses = flow_matching_losses(model, Y0, -Y1, s)  # any representative of [Y1]
    torch.testing.assert_close(losses, expected, rtol=1e-10, atol=1e-12)
    # d/dq of mean (q^4 s - theta)^2 with T = q^2
    losses.mean().backward()
    q = math.sqrt(T)
    grad = (2 * (T**2 * s - theta) * s * 4 * q**3).mean()
    torch.testing.assert_close(model.sqrt_T.grad, grad, rtol=1e-10, atol=1e-12)


def test_flow_matching_objective_matches_the_closed_form_with_learned_T():
    # catches the same time-convention bugs in the objective as drawn (e.g. times drawn on
    # [0, T] or s T passed to the geodesic): prior ~ e1 (sigma = 1e-6), data y1 on the circle
    T, theta, n = 2.0, 0.6, 4000
    model = rotation_flow(T)
    y1 = torch.tensor([math.cos(theta), math.sin(theta), 0]).expand(n, 3).unsqueeze(-1)
    loss, _ = flow_matching_objective(model, y1)
    # f(s) = (a s - theta)^2, a = T^2, s ~ U(0, 1): exact mean and variance
    a = T**2
    mean = ((a - theta) ** 3 + theta**3) / (3 * a)
    second = ((a - theta) ** 5 + theta**5) / (5 * a)
    sem = math.sqrt((second - mean**2) / n)
    assert abs(loss.item() - mean) < 4 * sem + 1e-3  # 1e-3: the prior's spread around e1
    mutated = ((T - theta) ** 3 + theta**3) / (3 * T)  # the loss of field(s, Y)
    assert abs(mutated - mean) > 20 * sem


@pytest.mark.slow
def test_flow_matching_model_beats_uniform_on_gr13():
    torch.manual_seed(1)
    gr = Grassmann(1, 3)
    target = MatrixGaussianPrior(gr, torch.eye(3)[:, 2:], 0.04 * torch.eye(3), torch.eye(1))
    model = GrCNF(gr, prior="uniform", train_T=False, atol=1e-6, rtol=1e-6)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss, _ = flow_matching_objective(model, target.sample((256,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    test = target.sample((300,))
    with torch.no_grad():
        nll = -model.log_prob(test)
    sem = nll.std().item() / 300**0.5
    assert nll.mean().item() + 4 * sem < gr.log_volume()  # uniform: 1.838
    # and not below the target's own entropy (the best possible NLL), up to noise
    assert nll.mean().item() > -target.log_prob(test).mean().item() - 4 * sem


def test_ot_pairing_is_the_optimal_assignment():
    import itertools

    from grassflow.training import ot_pairing

    torch.manual_seed(3)
    gr = Grassmann(2, 4)
    Y0, Y1 = gr.random(6), gr.random(6)
    perm = ot_pairing(gr, Y0, Y1)
    assert sorted(perm.tolist()) == list(range(6))

    def cost(p):
        return gr.dist(Y0[list(p)], Y1).square().sum().item()

    brute = min(cost(p) for p in itertools.permutations(range(6)))
    assert cost(perm.tolist()) == pytest.approx(brute, rel=1e-9)
    # invariant to the representatives of the points
    Q = random_orthogonal(2)
    assert torch.equal(ot_pairing(gr, Y0 @ Q, Y1), perm)


def test_ot_coupling_shortens_the_pairs_and_trains():
    from grassflow.training import OBJECTIVES

    torch.manual_seed(4)
    gr = Grassmann(1, 3)
    target = MatrixGaussianPrior(gr, torch.eye(3)[:, 2:], 0.04 * torch.eye(3), torch.eye(1))
    model = GrCNF(gr, prior="uniform", train_T=False)
    # the OT pairs' mean squared distance is below the independent pairs'
    Y0, Y1 = model.prior().sample((64,)), target.sample((64,))
    from grassflow.training import ot_pairing

    d_ind = gr.dist(Y0, Y1).square().mean()
    d_ot = gr.dist(Y0[ot_pairing(gr, Y0, Y1)], Y1).square().mean()
    assert d_ot < 0.7 * d_ind
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        loss, _ = OBJECTIVES["fm-ot"](model, target.sample((64,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-20:]) / 20 < 0.8 * sum(losses[:20]) / 20
    with pytest.raises(ValueError, match="coupling"):
        flow_matching_objective(model, Y1, coupling="sinkhorn")
