"""Tests for grassflow.nn.PointCloudField: a horizontal field on Gr(k, n - 1) from an EGNN on
the span's whitened points, and ShapeFlow(field="egnn") built on it.

The field is checked against its defining properties (horizontal, O(k)-equivariant,
equivariant under relabelling through ``Q = H^T Pi H``), the GrCNF it drives against the
uniform law by quadrature on Gr(2, 4) (clouds of n = 5 points in R^2, so n > d + 2), and the
whole ShapeFlow against an isotropic Gaussian by Monte Carlo in both directions.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import random_orthogonal
from grassflow.flows import GrCNF, ShapeFlow
from grassflow.manifolds import Grassmann
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn import EGNNField, PointCloudField
from quadrature import grassmann_rule, log_volume_grassmann
from test_shape_flow import calibrate_gram

TIGHT = {"atol": 1e-7, "rtol": 1e-7}


def strengthen(field: PointCloudField, rms: float, k: int, seed: int = 0) -> PointCloudField:
    """Random displacement heads (the EGNN starts near zero), rescaled so that the field's RMS
    norm over uniform [Y] at t = 0.5 is ``rms``: it moves mass, and the weights of the Monte
    Carlo tests keep a small variance."""
    gen = torch.Generator().manual_seed(seed)
    D = field.n_points - 1
    Y = Grassmann(k, D).random(400, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        for mlp in field.net.coord:
            mlp[-1].weight.copy_(0.5 * torch.randn(mlp[-1].weight.shape, generator=gen))
        for _ in range(3):  # the EGNN is nonlinear in the head's scale: iterate
            X = field(torch.tensor(0.5, dtype=torch.float64), Y)
            factor = rms / X.square().sum((-2, -1)).mean().sqrt()
            for mlp in field.net.coord:
                mlp[-1].weight.mul_(factor)
    return field


def make_field(n: int, k: int, rms: float = 1.0, labels=None) -> PointCloudField:
    torch.manual_seed(0)
    net = EGNNField(n, k, hidden=16, layers=2, labels=labels)
    return strengthen(PointCloudField(net, n).double(), rms, k)


@pytest.mark.parametrize("n,k", [(5, 2), (6, 3)])
def test_field_is_horizontal_and_equivariant(n, k):
    # catches: a missing horizontal projection, H used where H^T belongs (the field would not
    # commute with relabelling), or the whitened points built from Y^T instead of H Y
    field = make_field(n, k)
    Y = Grassmann(k, n - 1).random(8, dtype=torch.float64)
    t = torch.tensor(0.3, dtype=torch.float64)
    with torch.no_grad():
        X = field(t, Y)
        assert X.square().sum((-2, -1)).min() > 0.05  # not trivially zero
        torch.testing.assert_close(Y.mT @ X, torch.zeros(8, k, k, dtype=torch.float64),
                                   atol=1e-12, rtol=0)  # fmt: skip
        R = random_orthogonal(k, reflect=True).double()
        torch.testing.assert_close(field(t, Y @ R), X @ R, atol=1e-9, rtol=1e-9)
        H = helmert_basis(n)
        for perm in (torch.randperm(n), torch.tensor([1, 0, *range(2, n)])):
            Q = H.mT @ torch.eye(n, dtype=torch.float64)[perm] @ H
            torch.testing.assert_close(field(t, Q @ Y), Q @ X, atol=1e-9, rtol=1e-9)


def test_labels_restrict_the_relabelling_symmetry():
    # catches: labels that never reach the EGNN inside the field
    n, k = 5, 2
    field = make_field(n, k, labels=torch.tensor([0, 0, 1, 1, 1]))
    Y = Grassmann(k, n - 1).random(6, dtype=torch.float64)
    t, H = torch.tensor(0.3, dtype=torch.float64), helmert_basis(n)
    with torch.no_grad():
        X = field(t, Y)
        for perm, same in (([1, 0, 2, 3, 4], True), ([2, 1, 0, 3, 4], False)):
            Q = H.mT @ torch.eye(n, dtype=torch.float64)[perm] @ H
            err = (field(t, Q @ Y) - Q @ X).abs().max().item()
            assert (err < 1e-9) if same else (err > 1e-4), (perm, err)


def test_bad_arguments_raise():
    # catches: a field that silently maps spans of another n (the Helmert basis would not
    # match Y's rows) or accepts a scale that divides by zero
    with pytest.raises(ValueError, match="n_points"):
        PointCloudField(EGNNField(2, 1), 2)
    with pytest.raises(ValueError, match="scale"):
        PointCloudField(EGNNField(5, 2), 5, scale=0.0)
    field = PointCloudField(EGNNField(5, 2), 5)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, k\)"):
        field(torch.tensor(0.0), torch.randn(3, 5, 2))


def test_grcnf_with_the_field_is_normalized_by_quadrature():
    # catches: a divergence that is wrong for a field that is not a gradient (the generic
    # exact trace over the horizontal space), to 1%: V_Gr E_{U uniform}[p(U)] = 1 on Gr(2, 4).
    # The field RMS 0.3 keeps p smooth enough for the rule (with a float32-built field, 0.4 gave
    # 1.004 and 1.0 gave 1.68).
    k, D = 2, 4
    flow = GrCNF(Grassmann(k, D), make_field(D + 1, k, rms=0.3), prior="uniform",
                 **TIGHT).double().eval()  # fmt: skip
    U, w = grassmann_rule(k, D, 15)
    U, w = U.double(), w.double()
    with torch.no_grad():
        lp = flow.log_prob(U)
    assert (lp + flow.manifold.log_volume()).abs().max() > 0.5  # the flow moves mass
    total = (w * torch.exp(lp + log_volume_grassmann(k, D))).sum().item()
    assert abs(total - 1.0) < 3e-3, total


class Recorder(nn.Module):
    """Wraps a field and records whether it was called (the egnn option reaches the flow)."""

    def __init__(self, field):
        super().__init__()
        self.inner, self.calls = field, 0

    def forward(self, t, Y):
        self.calls += 1
        return self.inner(t, Y)


def calibrate_distance_gram(model: ShapeFlow, S: torch.Tensor, Y: torch.Tensor) -> None:
    """Random pair-target heads (so the centre S*(Y) depends on the span) and log-widths 0.7,
    the smallest variance of the weights against the test's isotropic Gaussian (0.3 to 1.0
    tried)."""
    gram, gen = model.gram, torch.Generator().manual_seed(2)
    gram.initialize(S, Y)
    with torch.no_grad():
        w = gram.pair[-1].weight
        w.copy_(0.05 * torch.randn(w.shape, generator=gen, dtype=w.dtype))
        gram.spread.bias[: 2 * gram.components] = math.log(0.7)


@pytest.mark.parametrize("gram", ["wishart", "distance"])
def test_shape_flow_egnn_is_normalized_and_invariant(gram):
    # catches: the egnn option building a field the flow does not use, a ShapeFlow density
    # that is not normalized with this field (n = 5 > d + 2 = 4, so the det S exponent is
    # live), or one that is not invariant to translation, O(d) and relabelling. "distance" is
    # the default model of `grassflow train --data`, built by the experiment's own builder
    # (a default that reached another Gram density, or S fed to it in another scale or basis
    # than its span's, would fail).
    # int p dP' = E_q[p / q] = 1 with q = N(0, s2 I) on the Helmert coordinates. Under q the
    # span is uniform and independent of S and the orientation, and q depends on S alone; the
    # span is integrated by the quadrature rule (p_Gr of an EGNN field has narrow peaks, up to
    # 10x its mean, that make plain Monte Carlo weak) and S and the orientation by Monte Carlo.
    # The Wishart Gram density is test_shape_flow's calibrated one (finite variance of the
    # weights). The log-normal's weights vary more, so its test detects 15 % errors, not 3 %:
    # a Jacobian exponent or a scale of S off by a factor moves the total by far more.
    from grassflow.nn.gram import DistanceGram
    from grassflow.tasks.shape_runs import ShapeExperiment, build_model

    n, d = 5, 2
    if gram == "wishart":
        model = ShapeFlow(n, d, "egnn", field_options={"hidden": 16, "layers": 2},
                          gram_options={"hidden": 8},
                          chunk_size=4096, **TIGHT).eval()  # fmt: skip
        calibrate_gram(model, dof=n - 1.0, w_spread=0.1, dof_spread=0.03)
    else:
        exp = ShapeExperiment(data="unused", n_points=n, dim=d, hidden=16, chunk_size=4096,
                              **TIGHT)  # fmt: skip
        model = build_model(exp).eval()
        assert isinstance(model.gram, DistanceGram) and exp.potential == "egnn"
    assert isinstance(model.flow.field, PointCloudField)
    model.flow.field = Recorder(make_field(n, d, rms=0.3))  # the quadrature test's field
    U, wq = grassmann_rule(d, n - 1, 15)
    m, s2, gen = len(U), 1.0 / (n - 1), torch.Generator().manual_seed(1)
    Pp = math.sqrt(s2) * torch.randn(m, n - 1, d, generator=gen)
    S = model.factor(helmert_basis(n) @ Pp)[1]  # q's law of S
    if gram == "distance":
        calibrate_distance_gram(model, S, U)
    R = torch.linalg.qr(torch.randn(m, d, d, generator=gen))[0]  # Haar orientations
    P = helmert_basis(n) @ (U @ S.sqrt() @ R)  # S is diagonal
    log_q = -0.5 * Pp.square().sum((-2, -1)) / s2 - 0.5 * (n - 1) * d * math.log(2 * math.pi * s2)
    with torch.no_grad():
        terms = model.log_prob_terms(P)
    assert model.flow.field.calls > 0
    g = torch.exp(terms["grassmann"] + model.manifold.log_volume())  # p_Gr / uniform
    r = torch.exp(terms["log_prob"] - log_q) / g  # the Gram and Jacobian parts' weight
    assert (g.log().abs().max() > 0.5) and (r.std() > 0.05)  # power: neither part is q's
    total = (wq * g * r).sum().item()
    tol = 4.0 * (wq * g * (r - r.mean())).square().sum().sqrt().item() + 3e-4
    power = {"wishart": 0.03, "distance": 0.15}[gram]  # an error of p it detects
    assert tol < power / 2  # power: such an error is more than tol + 3 standard errors off
    assert abs(total - 1.0) < tol, (total, tol)
    P, lp = P[:6], terms["log_prob"][:6]
    Q = random_orthogonal(d, reflect=True)
    with torch.no_grad():
        for P2 in (P @ Q + 3.0, P[:, torch.randperm(n)], P[:, [1, 2, 3, 4, 0]]):
            torch.testing.assert_close(model.log_prob(P2), lp, atol=1e-6, rtol=0)
