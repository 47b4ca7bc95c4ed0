"""The shape model's chemistry: the bond graph's edge features (grassflow.nn.egnn), the
harmonic prior and the exact law of its span (grassflow.distributions.harmonic), the
equivariant-OT coupling of a bonded model, and the config's round trip. The molecule
model's normalization, invariance and sampler are also in test_density_contract.py."""

import json
import math
from collections import deque

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.distributions import (
    MatrixAngularCentralGaussian,
    UniformGrassmann,
    bond_laplacian,
    harmonic_covariance,
)
from grassflow.flows import ShapeFlow, ShapeFlowConfig
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn.egnn import EGNNField, _ordered_pairs, bond_graph_features, graph_distances
from grassflow.training.shape_matching import cfm_objective

# cyclohexanol's heavy atoms and the hydroxyl H: a ring (0-5), O on 0, H on O; the C-O is
# written as a double bond only to give two bond orders
RING = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 0], [0, 6], [6, 7]])
RING_ORDERS = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0])
# the ring's mirror through atoms 0 and 3 keeps every bond and order: 1 <-> 5, 2 <-> 4
MIRROR = torch.tensor([0, 5, 4, 3, 2, 1, 6, 7])
# swapping atoms 1 and 6 keeps no graph: 6 (bonded to 0 and 7) takes 1's place
BREAK = torch.tensor([0, 6, 2, 3, 4, 5, 1, 7])


def _bfs(bonds, n):
    adj = [[] for _ in range(n)]
    for i, j in bonds.tolist():
        adj[i].append(j)
        adj[j].append(i)
    out = torch.full((n, n), n, dtype=torch.int64)
    for s in range(n):
        out[s, s], todo = 0, deque([s])
        while todo:
            u = todo.popleft()
            for v in adj[u]:
                if out[s, v] == n:
                    out[s, v] = out[s, u] + 1
                    todo.append(v)
    return out


def test_bond_graph_features_are_graph_distance_and_order_one_hots():
    # bug caught: Floyd-Warshall relaxing in the wrong order (too long paths), pairs in
    # another order than the messages', orders put on the wrong pair or on unbonded pairs
    n = 8
    bonds = torch.cat([RING, torch.tensor([[3, 7]])])  # a second ring, through the O-H
    orders = torch.cat([RING_ORDERS, torch.tensor([3.0])])
    hops = _bfs(bonds, n)
    torch.testing.assert_close(graph_distances(bonds, n), hops)
    F = bond_graph_features(bonds, n, orders)
    i, j = _ordered_pairs(n)
    assert F.shape == (n * (n - 1), 8) and torch.equal(F.sum(1), 1.0 + (hops[i, j] == 1))
    torch.testing.assert_close(F[:, :4].argmax(1), hops[i, j].clamp_max(4) - 1)
    order = {frozenset(b): o for b, o in zip(bonds.tolist(), orders.tolist(), strict=True)}
    for p, (a, b) in enumerate(zip(i.tolist(), j.tolist(), strict=True)):
        o = order.get(frozenset((a, b)))
        assert F[p, 4:].tolist() == [float(o == v) for v in (1.0, 1.5, 2.0, 3.0)]
    assert graph_distances(torch.tensor([[0, 1]]), 3)[0, 2] == 3  # disconnected: n


def _field(bonds=RING, orders=RING_ORDERS, gain=0.3):
    torch.manual_seed(4)
    f = EGNNField(8, 3, hidden=16, layers=2, bonds=bonds, bond_orders=orders)
    for mlp in f.coord:
        torch.nn.init.normal_(mlp[-1].weight, std=gain)
    return f


def test_bonded_field_is_equivariant_to_the_graphs_automorphisms_only():
    # bug caught: edge features that do not follow their points (indexed by position after a
    # permutation), that break E(3) equivariance, or that never reach the messages (the field
    # would stay equivariant to the bond-breaking swap, as the plain field is)
    f, plain = _field(), _field(None, None)
    x, t = torch.randn(3, 8, 3), torch.rand(3)
    Q, c = random_orthogonal(3), torch.randn(1, 1, 3)
    torch.testing.assert_close(f(t, (x @ Q)[:, MIRROR] + c), (f(t, x) @ Q)[:, MIRROR])
    torch.testing.assert_close(plain(t, x[:, BREAK]), plain(t, x)[:, BREAK])
    assert (f(t, x[:, BREAK]) - f(t, x)[:, BREAK]).abs().max() > 1e-3
    orders = RING_ORDERS.clone()
    orders[6] = 1.0  # the C-O order reaches the field too
    assert (_field(orders=orders)(t, x) - f(t, x)).abs().max() > 1e-4


def test_bad_bonds_are_named():
    # bug caught: a bond table silently accepted with an index outside the cloud, or orders
    # that the one-hot cannot hold (it would drop them)
    with pytest.raises(ValueError, match="out of range"):
        EGNNField(4, 3, bonds=torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="order"):
        EGNNField(4, 3, bonds=torch.tensor([[0, 1]]), bond_orders=torch.tensor([4.0]))
    with pytest.raises(ValueError, match="without bonds"):
        EGNNField(4, 3, bond_orders=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="harmonic"):
        ShapeFlowConfig(4, 3, prior="harmonic")
    with pytest.raises(ValueError, match="connected"):
        ShapeFlow(4, 3, bonds=torch.tensor([[0, 1], [2, 3]]), prior="harmonic")


def test_harmonic_covariance_is_the_laplacians_pseudo_inverse():
    # bug caught: Sigma = H^T L H (not its inverse), or another basis than the model's
    # Helmert basis (the prior would not be the harmonic law on centred clouds)
    H = helmert_basis(8)
    Sigma = harmonic_covariance(RING, 8)
    torch.testing.assert_close(H @ Sigma @ H.mT, torch.linalg.pinv(bond_laplacian(RING, 8)))
    assert torch.equal(bond_laplacian(RING, 8).sum(1), torch.zeros(8))


def _molecule(prior_std=0.7):
    m = ShapeFlow(8, 3, hidden=8, layers=1, prior_std=prior_std, bonds=RING,
                  bond_orders=RING_ORDERS, prior="harmonic")  # fmt: skip
    for mlp in m.field.coord:
        torch.nn.init.zeros_(mlp[-1].weight)
    return m


def test_harmonic_prior_density_and_sampler_are_the_gaussian_with_that_covariance():
    # bug caught: a log-determinant with the wrong sign or power of d, draws C^T eps (whose
    # covariance is C^T C, not Sigma), or a fitted scale without the whitening
    s = 0.7
    m = _molecule(s)
    cov = torch.kron(s**2 * harmonic_covariance(RING, 8), torch.eye(3))  # vec(z) row-major
    mvn = torch.distributions.MultivariateNormal(torch.zeros(21), cov)
    z = m.helmert(torch.randn(5, 8, 3))
    torch.testing.assert_close(m.prior_log_prob(z), mvn.log_prob(z.flatten(1)))
    with torch.no_grad():  # the zero field: the model's density is the prior's
        torch.testing.assert_close(m.log_prob(m.clouds(z)), mvn.log_prob(z.flatten(1)))
    zs = m.helmert(m.sample_prior(40_000, torch.Generator().manual_seed(0)))
    second = torch.einsum("bia,bja->bij", zs, zs) / 3  # E = s^2 Sigma
    target = s**2 * harmonic_covariance(RING, 8)
    err = (second.mean(0) - target).abs()
    tol = 4 * second.std(0) / len(zs) ** 0.5
    assert (err < tol).float().mean() > 0.98  # 4 SE per entry; 49 entries
    assert tol.max() < 0.1 * target.diagonal().min()  # power: a wrong factor moves > 10 %
    assert _molecule(1.0).fit_prior(m.clouds(zs)) == pytest.approx(s, rel=0.01)


@pytest.fixture
def macg():
    A = torch.randn(5, 5)
    Sigma = A @ A.T / 5 + 0.5 * torch.eye(5)
    return MatrixAngularCentralGaussian(Sigma, 2)


def test_macg_integrates_to_one(macg):
    # bug caught: a wrong exponent (-(m - 1)/2, or d/2 on det Sigma), a missing volume, a
    # density with respect to another measure than the Riemannian volume
    gr = Grassmann(2, 5)
    w = torch.exp(macg.log_prob(gr.random(200_000)) + gr.log_volume())
    assert mc_tolerance(w) < 0.02  # power: an exponent off by 1/2 moves it by > 0.1
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))


def test_macg_sampler_is_the_law_of_its_density(macg):
    # bug caught: a sampler that ignores Sigma (or uses Sigma^{-1}): E_q[1 / (p V)] = 1 holds
    # only when the draws q are p's own law
    Y = macg.sample((100_000,), torch.Generator().manual_seed(1))
    assert torch.allclose(Y.mT @ Y, torch.eye(2).expand(len(Y), 2, 2), atol=1e-10)
    w = torch.exp(-macg.log_prob(Y) - Grassmann(2, 5).log_volume())
    assert mc_tolerance(w) < 0.02
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))
    bad = MatrixAngularCentralGaussian(torch.linalg.inv(macg.Sigma), 2)
    assert abs(torch.exp(-bad.log_prob(Y) - Grassmann(2, 5).log_volume()).mean() - 1) > 0.1


def test_macg_matches_the_angular_central_gaussian_and_the_uniform_law():
    # bug caught: a constant that is right only for d = 1 or only for Sigma = I; a density
    # that depends on the basis of the subspace
    Sigma = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, 0.2], [0.0, 0.2, 0.5]])
    x = torch.nn.functional.normalize(torch.randn(6, 3), dim=-1)
    # Tyler's ACG on the sphere S^2, doubled for the projective plane Gr(1, 3) = S^2 / +-1
    acg = (math.lgamma(1.5) - math.log(2 * math.pi**1.5) - 0.5 * torch.logdet(Sigma)
           - 1.5 * torch.log((x @ torch.linalg.inv(Sigma) * x).sum(-1)))  # fmt: skip
    torch.testing.assert_close(MatrixAngularCentralGaussian(Sigma, 1).log_prob(x[..., None]),
                               acg + math.log(2))  # fmt: skip
    Y = Grassmann(3, 7).random(4)
    Q = random_orthogonal(3)
    iso = MatrixAngularCentralGaussian(2.5 * torch.eye(7), 3)
    torch.testing.assert_close(iso.log_prob(Y @ Q), UniformGrassmann(Grassmann(3, 7)).log_prob(Y))
    with pytest.raises(ValueError, match="positive definite"):
        MatrixAngularCentralGaussian(-torch.eye(4), 2)
    with pytest.raises(ValueError, match="dimension"):
        MatrixAngularCentralGaussian(torch.eye(4), 4)


def test_the_harmonic_priors_span_is_the_macg():
    # the Grassmann part of the prior in closed form: spans of harmonic draws, scored by
    # the MACG, satisfy E_q[1 / (p V)] = 1. Bug caught: a prior whose draws are not
    # N(0, Sigma ⊗ I) (the spans would follow another law) or a Sigma in the wrong basis
    z = _molecule().helmert(_molecule().sample_prior(200_000, torch.Generator().manual_seed(2)))
    Y = torch.linalg.qr(z)[0]
    law = MatrixAngularCentralGaussian(harmonic_covariance(RING, 8), 3)
    w = torch.exp(-law.log_prob(Y) - Grassmann(3, 7).log_volume())
    assert mc_tolerance(w) < 0.05
    assert w.mean().item() == pytest.approx(1.0, abs=mc_tolerance(w))
    iso = torch.linalg.qr(torch.randn(200_000, 7, 3))[0]  # power: spans that ignore the graph
    assert abs(torch.exp(-law.log_prob(iso) - Grassmann(3, 7).log_volume()).mean() - 1) > 0.2


def test_bonded_equivariant_ot_rotates_but_never_relabels(monkeypatch):
    # bug caught: the coupling relabelling a bonded model's clouds within an element (it
    # would pair the prior with molecules whose bonds join other atoms)
    seen = {}
    losses = lambda model, x0, x1, t, g, labels=None: seen.update(x0=x0, x1=x1) or x1.sum(-1)
    monkeypatch.setattr("grassflow.training.shape_matching.cfm_losses", losses)
    model = ShapeFlow(8, 3, hidden=8, layers=1, bonds=RING, prior="harmonic")
    data = torch.randn(6, 8, 3) + 1.0
    cfm_objective(model, data)
    x1 = seen["x1"]
    centred = data - data.mean(1, keepdim=True)
    for b in range(6):
        torch.testing.assert_close(torch.cdist(x1[b], x1[b]), torch.cdist(centred[b], centred[b]))
        R = torch.linalg.lstsq(centred[b], x1[b]).solution  # x1 = centred @ R, R orthogonal
        torch.testing.assert_close(R.mT @ R, torch.eye(3))


def test_bonded_config_round_trips_through_json():
    # bug caught: bonds, orders or the prior lost on save (a reloaded run would score with
    # another field and another prior)
    m = ShapeFlow(8, 3, hidden=8, layers=1, bonds=RING, bond_orders=RING_ORDERS,
                  prior="harmonic", labels=torch.tensor([6] * 6 + [8, 1]))  # fmt: skip
    m.fit_prior(torch.randn(20, 8, 3))
    for mlp in m.field.coord:
        torch.nn.init.normal_(mlp[-1].weight, std=0.3)
    config = ShapeFlowConfig.from_dict(json.loads(json.dumps(m.config.to_dict())))
    assert config == m.config and config.prior == "harmonic"
    again = ShapeFlow.from_config(config)
    again.load_state_dict(m.state_dict())
    P = torch.randn(3, 8, 3)
    with torch.no_grad():
        torch.testing.assert_close(again.log_prob(P), m.log_prob(P))


def test_find_hand_needs_one_hand_in_every_cloud_and_a_non_flat_centre():
    # bug caught: a hand found in racemic data (every mirror-image test cloud would get
    # -inf), at a planar centre (its sign is noise), or with neighbours ordered so the data's
    # volume is negative
    from grassflow.data.molecule_files import find_hand

    g = torch.Generator().manual_seed(0)
    tetra = torch.tensor([[0, 0, 0], [1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    bonds = [[0, 1], [0, 2], [0, 3], [0, 4]]
    Q = torch.stack([random_orthogonal(3, reflect=False) for _ in range(200)])
    one_hand = (tetra + 0.1 * torch.randn(200, 5, 3, generator=g)) @ Q
    hand = find_hand(one_hand.numpy(), bonds)
    c, *js = hand
    assert c == 0 and (torch.linalg.det(one_hand[:, js] - one_hand[:, [c]]) > 0).all()
    mirrored = one_hand * torch.tensor([1.0, 1.0, -1.0])
    assert find_hand(torch.cat([one_hand, mirrored]).numpy(), bonds) is None
    flat = tetra * torch.tensor([1.0, 1.0, 0.0])  # a planar centre: the sign is noise
    flat = (flat + 0.1 * torch.randn(200, 5, 3, generator=g)) @ Q
    assert find_hand(flat.numpy(), bonds) is None


def test_a_handed_model_is_twice_as_dense_on_its_hand_and_never_draws_the_mirror():
    # bug caught: the hand's log 2 missing (the density would integrate to 1/2), mirror images
    # scored, samples of the wrong hand returned, or a rotation that flips the hand
    kw = dict(hidden=8, layers=1, bonds=RING, bond_orders=RING_ORDERS, prior="harmonic")
    plain, handed = ShapeFlow(8, 3, **kw), ShapeFlow(8, 3, **kw, hand=(0, 1, 5, 6))
    for mlp in plain.field.coord:
        torch.nn.init.normal_(mlp[-1].weight, std=0.3)
    handed.load_state_dict(plain.state_dict())  # the same flow: the hand is not a parameter
    X = handed.sample(50, torch.Generator().manual_seed(3))
    vol = torch.linalg.det(X[:, [1, 5, 6]] - X[:, [0]])
    assert (vol > 0).all()
    with torch.no_grad():
        torch.testing.assert_close(handed.log_prob(X), plain.log_prob(X) + math.log(2))
        mirror = X * torch.tensor([-1.0, 1.0, 1.0])
        assert torch.isinf(handed.log_prob(mirror)).all() and (handed.log_prob(mirror) < 0).all()
        turned = X @ random_orthogonal(3, reflect=False)
        torch.testing.assert_close(handed.log_prob(turned), handed.log_prob(X), atol=1e-3,
                                   rtol=0)  # the ODE's tolerance; a flipped hand gives -inf
    Y, lp = handed.sample_with_log_prob(5, torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(lp, handed.log_prob(Y), atol=1e-2, rtol=0)  # log 2 = 0.69
    with pytest.raises(ValueError, match="distinct point indices"):
        ShapeFlow(8, 3, hand=(0, 1, 1, 6))


def test_bond_graph_features_tell_torsion_partners_from_farther_atoms():
    # bug caught (issue 42's audit): the graph distance clamped one hop too early, so that atoms
    # three bonds apart (torsion partners) get the features of atoms four or more apart; the
    # ring above has no pair that far, a chain of seven atoms has them all
    n = 7
    bonds = torch.tensor([[a, a + 1] for a in range(n - 1)])
    F = bond_graph_features(bonds, n)
    i, j = _ordered_pairs(n)
    hops = (i - j).abs()
    assert torch.equal(F[:, :4].argmax(1), hops.clamp_max(4) - 1)
    by_hops = {int(h): F[p] for p, h in enumerate(hops)}
    assert not torch.equal(by_hops[3], by_hops[4])
    assert torch.equal(by_hops[4], by_hops[5]) and torch.equal(by_hops[5], by_hops[6])


def test_sample_with_log_prob_of_a_handed_model_draws_its_hand_only():
    # bug caught (issue 42's audit): sample_with_log_prob dropping the reflection into the hand
    # that sample() makes, so that the path Boltzmann reweighting uses returns mirror images
    # (and their density, zero, as -inf weights); an untrained model draws both hands evenly
    torch.manual_seed(2)
    model = ShapeFlow(5, 3, hidden=8, layers=1, hand=(0, 1, 2, 3), atol=1e-4, rtol=1e-4,
                      chunk_size=16).double()  # fmt: skip
    X, log_p = model.sample_with_log_prob(16, torch.Generator().manual_seed(0))
    assert (model.handedness(X) > 0).all()
    assert torch.isfinite(log_p).all()
    with torch.no_grad():
        torch.testing.assert_close(model.log_prob(X), log_p, atol=1e-2, rtol=0)
    prior = model.sample_prior(16, torch.Generator().manual_seed(0))
    assert (model.handedness(prior) < 0).any()  # power: the prior itself has both hands
