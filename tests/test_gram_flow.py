"""Tests for GramFlow (grassflow.nn.gram_flow): a conditional CNF on log S around a Gram density.

References: importance sampling against the base density (normalization of log_prob, and of
the sampler's law), the base itself (a fresh flow is the identity), group actions applied by
hand (equivariance, relabelling), and the two-stage training's checkpoints.
"""

from __future__ import annotations

import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.flows import ShapeFlow
from grassflow.manifolds import Grassmann
from grassflow.nn.gram import WishartGram
from grassflow.nn.gram_flow import GramFlow

N, K = 5, 2


def _perturbed(seed: int = 0, scale: float = 0.01) -> GramFlow:
    """A GramFlow whose field is nonzero (a fresh one is the identity) and changes volume: its
    pair weights respond strongly to the current pair distances (the log d^2 input)."""
    torch.manual_seed(seed)
    flow = GramFlow(WishartGram(N, K, dof=8.0), atol=1e-8, rtol=1e-8).double()
    with torch.no_grad():
        for layer in (flow.pair[-1], flow.trace[-1]):
            layer.weight.normal_(0, scale)
            layer.bias.normal_(0, scale)
        flow.pair[0].weight[:, -2] *= 10  # the log d^2 column
    return flow


def _span(m: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return Grassmann(K, N - 1).random(1, dtype=torch.float64).expand(m, N - 1, K)


def test_fresh_gram_flow_is_its_base():
    # catches: a nonzero field at initialization, or Jacobian terms that do not cancel on the
    # identity flow (log|dexp| at E_0 and E_1 with the same sign)
    flow = GramFlow(WishartGram(N, K)).double()
    Y = Grassmann(K, N - 1).random(6, dtype=torch.float64)
    S = flow.base.sample(Y, torch.Generator().manual_seed(1))
    torch.testing.assert_close(flow.log_prob(S, Y), flow.base.log_prob(S, Y), atol=1e-9, rtol=0)
    S2 = flow.sample(Y, torch.Generator().manual_seed(1))
    torch.testing.assert_close(S2, S, atol=1e-9, rtol=0)


def test_log_prob_integrates_to_one_and_the_divergence_matters(monkeypatch):
    # catches: a wrong sign or scale of the divergence integral, a missing log|dexp| Jacobian,
    # sym_coords scaling errors (the integral of p/q under q is 1 only for a normalized p).
    # Power guard: the same estimate without the divergence term is off by many tolerances.
    flow = _perturbed()
    m = 4000
    Y = _span(m, 3)
    with torch.no_grad():
        S = flow.base.sample(Y, torch.Generator().manual_seed(4))
        w = (flow.log_prob(S, Y) - flow.base.log_prob(S, Y)).exp()
        tol = mc_tolerance(w)
        assert abs(w.mean().item() - 1) < tol
        assert tol < 0.03
        real = flow._divergence
        monkeypatch.setattr(flow, "_divergence",
                            lambda *a: (real(*a)[0], torch.zeros(a[1].shape[:-1])))  # fmt: skip
        w_bad = (flow.log_prob(S, Y) - flow.base.log_prob(S, Y)).exp()
    assert abs(w_bad.mean().item() - 1) > 3 * mc_tolerance(w_bad)


def test_sampler_follows_log_prob():
    # catches: a sampler that integrates the field backwards or from the wrong end, or a
    # density that is not the sampler's law: E_{S ~ p}[q(S) / p(S)] = 1 for the base q
    flow = _perturbed(seed=1)
    m = 3000
    Y = _span(m, 5)
    with torch.no_grad():
        S = flow.sample(Y, torch.Generator().manual_seed(6))
        w = (flow.base.log_prob(S, Y) - flow.log_prob(S, Y)).exp()
    assert abs(w.mean().item() - 1) < mc_tolerance(w)
    assert w.std() > 0.1  # the flow moved: a wrong direction would show


def test_gram_flow_is_equivariant_and_relabelling_invariant():
    # catches: a field that reads S in a fixed frame (u or E not rotated together), or pair
    # terms that depend on the order of the points
    flow = _perturbed(seed=2)
    Y = Grassmann(K, N - 1).random(4, dtype=torch.float64)
    S = flow.base.sample(Y, torch.Generator().manual_seed(7))
    lp = flow.log_prob(S, Y)
    Q = random_orthogonal(K).double()
    torch.testing.assert_close(flow.log_prob(Q.mT @ S @ Q, Y @ Q), lp, atol=1e-6, rtol=0)
    H = flow.graph.H
    perm = torch.tensor([3, 0, 4, 1, 2])
    Yp = H.mT @ H[perm] @ Y  # the same span's points, relabelled, in Helmert coordinates
    torch.testing.assert_close(flow.log_prob(S, Yp), lp, atol=1e-6, rtol=0)


def test_fm_loss_trains_the_field_and_leaves_the_base():
    # catches: flow matching that leaks gradients into the (separately trained) base, or a
    # loss that does not reach the field's last layer
    flow = GramFlow(WishartGram(N, K)).double()
    Y = Grassmann(K, N - 1).random(8, dtype=torch.float64)
    S = flow.base.sample(Y, torch.Generator().manual_seed(9))
    flow.fm_loss(S, Y).mean().backward()
    assert all(p.grad is None for p in flow.base.parameters())
    assert flow.pair[-1].weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_two_stage_training_keeps_the_best_base(tmp_path):
    # catches: the CNF stage starting from the base's last instead of best checkpoint, or
    # changing the base
    from grassflow.experiments.shapes import train_gram
    from grassflow.training import TrainConfig, load_checkpoint

    torch.manual_seed(0)
    model = ShapeFlow(N, K, gram="wishart-flow").double()
    P = torch.randn(64, N, K, dtype=torch.float64)
    config = TrainConfig(lr=1e-2, batch_size=32, iterations=6, val_every=3, log_every=3,
                         checkpoint_every=3, dtype="float64")  # fmt: skip
    train_gram(model, P[:48], P[48:], tmp_path, config, progress=False)
    base = load_checkpoint(tmp_path / "gram_base" / "best.pt")["model"]
    final = load_checkpoint(tmp_path / "gram" / "last.pt")["model"]
    for key, value in base.items():
        torch.testing.assert_close(final[key.replace("gram.", "gram.base.", 1)], value)
