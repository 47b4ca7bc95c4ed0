import math

import pytest
import torch

from conftest import random_orthogonal
from grassflow import Grassmann, GrCNF, MatrixGaussianPrior
from grassflow.manifolds import orthonormality_error
from grassflow.training import flow_matching_objective

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


def test_flow_matching_loss_is_equivariant_and_decreases():
    torch.manual_seed(0)
    gr = Grassmann(2, 4)
    target = MatrixGaussianPrior(gr, gr.random(), 0.05 * torch.eye(4), torch.eye(2))
    model = GrCNF(gr, prior="uniform", train_T=False)
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
