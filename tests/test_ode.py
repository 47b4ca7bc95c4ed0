"""Tests for grassflow.ode: the Cayley RKMK and the projected ambient integrators.

The test dynamics is the time-dependent Oja flow ``X = g(t) theta (I - Y Y^T) C Y`` with C
symmetric and ``g(t) = 1 + t``, the Grassmann gradient flow of ``tr(Y^T C Y) / 2``. With
``Z = expm(theta (G(t1) - G(t0)) C) Y0`` and ``G(t) = t + t^2 / 2``, the exact solution is
``span Y(t1) = span Z`` and, for ``r = g theta tr(Y^T C Y)``,
``a(t1) - a(t0) = log det(Z^T Z) / 2`` (differentiate ``log det(Z^T Z)`` along the flow).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from grassflow.manifolds import Grassmann, orthonormality_error
from grassflow.ode import METHODS, cayley_lowrank, odeint_grassmann, polar_newton_schulz

DT = torch.float64
D, K, B = 5, 2, 4
TOL = {"atol": 1e-8, "rtol": 1e-8}


class Oja(nn.Module):
    """O(k)-equivariant horizontal test dynamics with a scalar parameter ``theta``."""

    def __init__(self, C: torch.Tensor, theta: float = 1.0):
        super().__init__()
        self.register_buffer("C", C)
        self.theta = nn.Parameter(torch.tensor(theta, dtype=C.dtype))
        self.times: list[float] = []

    def forward(self, t, Y):
        self.times.append(t.item())
        g = self.theta * (1.0 + t)
        CY = self.C @ Y
        return g * (CY - Y @ (Y.mT @ CY)), g * (Y * CY).sum(dim=(-2, -1))


def G(t: float) -> float:
    return t + 0.5 * t * t


def exact(oja: Oja, Y0, a0, t0=0.0, t1=1.0):
    """Closed-form ``(Z, a1)``: ``span Y(t1) = span Z``; differentiable in theta and Y0."""
    Z = torch.linalg.matrix_exp(oja.theta * (G(t1) - G(t0)) * oja.C) @ Y0
    return Z, a0 + 0.5 * torch.logdet(Z.mT @ Z) - 0.5 * torch.logdet(Y0.mT @ Y0)


def projector_gap(Y, Z):
    """Largest entry of ``|P_Y - P_Z|`` with P the orthogonal projector onto the span."""
    Q = torch.linalg.qr(Z)[0]
    return (Y @ Y.mT - Q @ Q.mT).abs().max().item()


def random_orthogonal(k, generator, det=-1.0):
    Q = torch.linalg.qr(torch.randn(k, k, generator=generator, dtype=DT))[0]
    if torch.linalg.det(Q).item() * det < 0:
        Q = Q * torch.tensor([-1.0] + [1.0] * (k - 1), dtype=DT)
    return Q


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def oja(gen):
    C = torch.randn(D, D, generator=gen, dtype=DT)
    # eigenvalue spread ~3: mild, because the backward Oja flow amplifies errors by exp(spread)
    return Oja(0.25 * (C + C.mT))


@pytest.fixture
def Y0(gen):
    return Grassmann(K, D).random(B, generator=gen, dtype=DT)


@pytest.fixture
def a0(gen):
    return torch.randn(B, generator=gen, dtype=DT)


# ------------------------------------------------------------------ building blocks
@pytest.mark.parametrize("r", [3, 6])  # 2r = 12 > D = 9 takes the dense branch
def test_cayley_lowrank_matches_dense(gen, r):
    Dn = 9
    A, Bm = (torch.randn(2, Dn, r, generator=gen, dtype=DT) for _ in range(2))
    U, V = torch.cat([A, -Bm], -1), torch.cat([Bm, A], -1)  # U V^T = A B^T - B A^T, skew
    S = U @ V.mT
    Y = Grassmann(2, Dn).random(2, generator=gen, dtype=DT)
    eye = torch.eye(Dn, dtype=DT)
    dense = torch.linalg.solve(eye - 0.5 * S, (eye + 0.5 * S) @ Y)
    out = cayley_lowrank(U, V, Y)
    assert torch.allclose(out, dense, atol=1e-12)
    assert orthonormality_error(out).max() < 1e-13


def test_polar_newton_schulz(gen):
    Y = Grassmann(3, 7).random(5, generator=gen, dtype=DT)
    Yp = Y + 0.02 * torch.randn(Y.shape, generator=gen, dtype=DT)
    U, _, Vh = torch.linalg.svd(Yp, full_matrices=False)
    assert torch.allclose(polar_newton_schulz(Yp), U @ Vh, atol=1e-13)
    Q = random_orthogonal(3, gen)
    assert torch.allclose(polar_newton_schulz(Yp @ Q), polar_newton_schulz(Yp) @ Q, atol=1e-13)
    # finite backward exactly at an orthonormal point, where eigh/svd backward break down
    Y.requires_grad_(True)
    assert torch.autograd.gradcheck(polar_newton_schulz, (Y[:2],))


# ------------------------------------------------------------------------ accuracy
@pytest.mark.parametrize("method", METHODS)
def test_matches_closed_form(method, oja, Y0, a0):
    Y1, a1, _ = odeint_grassmann(oja, Y0, a0, method=method, **TOL)
    Z, a_ref = exact(oja, Y0, a0)
    assert projector_gap(Y1, Z) < 1e-6
    assert torch.allclose(a1, a_ref, atol=1e-6, rtol=0)
    assert Y1.shape == Y0.shape and a1.shape == a0.shape and Y1.dtype == DT


def test_methods_agree(oja, Y0, a0):
    Ya, aa, _ = odeint_grassmann(oja, Y0, a0, method="cayley_rkmk", **TOL)
    Yb, ab, _ = odeint_grassmann(oja, Y0, a0, method="ambient", **TOL)
    assert projector_gap(Ya, Yb) < 1e-6
    # a horizontal flow has a unique lift, so even the representatives agree
    assert torch.allclose(Ya, Yb, atol=1e-6)
    assert torch.allclose(aa, ab, atol=1e-6, rtol=0)


def test_rkmk_stays_orthonormal(gen):
    # larger problem, longer time, looser tolerance: many steps and no re-projection
    Dn, k = 12, 3
    C = torch.randn(Dn, Dn, generator=gen, dtype=DT)
    oja = Oja(0.5 * (C + C.mT))
    Y0 = Grassmann(k, Dn).random(6, generator=gen, dtype=DT)
    Y1, _, stats = odeint_grassmann(oja, Y0, 0.0, 0.0, 2.0, atol=1e-6, rtol=1e-6)
    assert stats["steps"] > 20
    assert orthonormality_error(Y1).max() <= 1e-10


@pytest.mark.parametrize("method", METHODS)
def test_leading_batch_shape(method, oja, gen):
    Y0 = Grassmann(K, D).random(2, 3, generator=gen, dtype=DT)
    Y1, a1, _ = odeint_grassmann(oja, Y0, 0.5, method=method, **TOL)
    Z, a_ref = exact(oja, Y0, torch.full((2, 3), 0.5, dtype=DT))
    assert Y1.shape == (2, 3, D, K) and a1.shape == (2, 3)
    assert projector_gap(Y1, Z) < 1e-6
    assert torch.allclose(a1, a_ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_float32(method, oja, Y0):
    oja = oja.float()
    Y1, a1, _ = odeint_grassmann(oja, Y0.float(), 0.0, method=method)
    assert Y1.dtype == torch.float32 and a1.dtype == torch.float32
    assert orthonormality_error(Y1).max() < 1e-5
    Z, a_ref = exact(oja.double(), Y0, torch.zeros(B, dtype=DT))
    assert projector_gap(Y1.double(), Z) < 1e-3


# --------------------------------------------------------- structure of the solution
@pytest.mark.parametrize("method", METHODS)
def test_backward_integration_inverts(method, oja, Y0, a0):
    Y1, a1, _ = odeint_grassmann(oja, Y0, a0, 0.0, 1.0, method=method, **TOL)
    Yb, ab, _ = odeint_grassmann(oja, Y1, a1, 1.0, 0.0, method=method, **TOL)
    assert projector_gap(Yb, Y0) < 1e-6
    assert torch.allclose(Yb, Y0, atol=1e-6)
    assert torch.allclose(ab, a0, atol=1e-6, rtol=0)
    # backward from the exact point against the closed form of the backward flow
    Z, a_ref = exact(oja, Y1, a1, 1.0, 0.0)
    assert projector_gap(Yb, Z) < 1e-6
    assert torch.allclose(ab, a_ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_equivariance(method, oja, Y0, a0, gen):
    Q = random_orthogonal(K, gen, det=-1.0)  # a reflection, not only a rotation
    Y1, a1, _ = odeint_grassmann(oja, Y0, a0, method=method, **TOL)
    Y1q, a1q, _ = odeint_grassmann(oja, Y0 @ Q, a0, method=method, **TOL)
    assert torch.allclose(Y1q, Y1 @ Q, atol=1e-6)
    assert torch.allclose(a1q, a1, atol=1e-6, rtol=0)


@pytest.mark.parametrize("t0, t1", [(0.0, 1.0), (1.0, -0.5)])
def test_rkmk_nfe_and_no_overshoot(t0, t1, oja, Y0):
    _, _, stats = odeint_grassmann(oja, Y0, 0.0, t0, t1, **TOL)
    attempts = stats["steps"] + stats["rejected"]
    assert stats["steps"] > 0
    assert stats["nfe"] == len(oja.times) == 2 + 6 * attempts  # f(t0), first-step probe
    lo, hi = min(t0, t1), max(t0, t1)
    assert all(lo <= t <= hi for t in oja.times)
    oja.times.clear()
    _, _, stats = odeint_grassmann(oja, Y0, 0.0, t0, t1, first_step=0.05, **TOL)
    assert stats["nfe"] == len(oja.times) == 1 + 6 * (stats["steps"] + stats["rejected"])
    assert abs(oja.times[1] - t0) <= 0.05 * 0.2 + 1e-15  # first stage node c_2 h


@pytest.mark.parametrize("adjoint", [False, True])
def test_ambient_nfe(adjoint, oja, Y0):
    _, _, stats = odeint_grassmann(oja, Y0, 0.0, method="ambient", adjoint=adjoint, **TOL)
    assert stats["steps"] > 0 and stats["nfe"] == len(oja.times) > 6 * stats["steps"]


@pytest.mark.parametrize("method", METHODS)
def test_zero_length_interval(method, oja, Y0, a0):
    Y1, a1, stats = odeint_grassmann(oja, Y0, a0, 0.3, 0.3, method=method)
    assert torch.equal(Y1, Y0) and torch.equal(a1, a0) and stats["nfe"] == 0


# ------------------------------------------------------------------------ gradients
def _loss(Y1, a1, W):
    """O(k)-invariant loss, so it depends on the subspaces only."""
    return (Y1 * (W @ Y1)).sum() + (a1 * torch.arange(1.0, B + 1, dtype=DT)).sum()


def _grads(oja, Y0, a0, W, solve):
    Y0 = Y0.clone().requires_grad_(True)
    a0 = a0.clone().requires_grad_(True)
    oja.zero_grad()
    Y1, a1 = solve(Y0, a0)
    _loss(Y1, a1, W).backward()
    # only the horizontal part of dL/dY0 is defined by the flow on the manifold
    gY = Y0.grad - Y0.detach() @ (Y0.detach().mT @ Y0.grad)
    return oja.theta.grad.item(), gY, a0.grad


def test_gradients_agree(oja, Y0, a0, gen):
    W = torch.randn(D, D, generator=gen, dtype=DT)
    W = W + W.mT
    tol = {"atol": 1e-10, "rtol": 1e-10}

    def closed(Y, a):
        Z, a1 = exact(oja, Y, a)
        return Z @ torch.linalg.inv(torch.linalg.cholesky(Z.mT @ Z)).mT, a1

    def solver(dynamics=oja, **kwargs):
        return lambda Y, a: odeint_grassmann(dynamics, Y, a, **tol, **kwargs)[:2]

    runs = {
        "closed_form": closed,
        "rkmk": solver(),
        "ambient": solver(method="ambient"),
        "adjoint": solver(method="ambient", adjoint=True),
        "adjoint_params": solver(
            lambda t, Y: oja(t, Y), method="ambient", adjoint=True, adjoint_params=(oja.theta,)
        ),
    }
    ref_theta, ref_Y, ref_a = _grads(oja, Y0, a0, W, closed)
    for name, solve in runs.items():
        g_theta, g_Y, g_a = _grads(oja, Y0, a0, W, solve)
        assert math.isclose(g_theta, ref_theta, rel_tol=1e-6), name
        assert torch.allclose(g_Y, ref_Y, atol=1e-6), name
        assert torch.allclose(g_a, ref_a, atol=1e-9), name

    # central finite difference in theta through the solver itself
    eps, vals = 1e-4, []
    with torch.no_grad():
        for s in (1.0, -1.0):
            oja.theta.fill_(1.0 + s * eps)
            vals.append(_loss(*odeint_grassmann(oja, Y0, a0, **tol)[:2], W).item())
    assert math.isclose((vals[0] - vals[1]) / (2 * eps), ref_theta, rel_tol=1e-6)


# --------------------------------------------------------------------------- errors
def test_input_errors(oja, Y0):
    with pytest.raises(ValueError, match="method"):
        odeint_grassmann(oja, Y0, 0.0, method="rk4")
    bad = Y0.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        odeint_grassmann(oja, bad, 0.0)
    with pytest.raises(ValueError, match="orthonormal"):
        odeint_grassmann(oja, 2.0 * Y0, 0.0)
    with pytest.raises(ValueError, match="shape"):
        odeint_grassmann(oja, torch.randn(D, dtype=DT), 0.0)
    with pytest.raises(ValueError, match="k < D"):
        odeint_grassmann(oja, torch.eye(3, dtype=DT).expand(2, 3, 3), 0.0)
    with pytest.raises(ValueError, match="a0"):
        odeint_grassmann(oja, Y0, torch.zeros(B + 1, dtype=DT))
    with pytest.raises(ValueError, match="t1"):
        odeint_grassmann(oja, Y0, 0.0, 0.0, float("inf"))
    with pytest.raises(ValueError, match="rtol"):
        odeint_grassmann(oja, Y0, 0.0, rtol=-1.0)
    with pytest.raises(ValueError, match="adjoint"):
        odeint_grassmann(oja, Y0, 0.0, adjoint=True)
    with pytest.raises(ValueError, match="adjoint_params"):
        odeint_grassmann(lambda t, Y: oja(t, Y), Y0, 0.0, method="ambient", adjoint=True)


@pytest.mark.parametrize("method", METHODS)
def test_bad_dynamics_output(method, oja, Y0):
    with pytest.raises(ValueError, match="dynamics must return"):
        odeint_grassmann(
            lambda t, Y: (oja(t, Y)[0], torch.zeros(1, dtype=DT)), Y0, 0.0, method=method
        )


@pytest.mark.parametrize("method", METHODS)
def test_max_steps(method, oja, Y0):
    with pytest.raises(RuntimeError, match="max_steps|max_num_steps"):
        odeint_grassmann(oja, Y0, 0.0, method=method, max_steps=3, **TOL)


def test_rkmk_nonfinite_dynamics(oja, Y0):
    def blows_up(t, Y):
        X, r = oja(t, Y)
        return (X / 0.0, r) if t > 0.5 else (X, r)

    with pytest.raises(RuntimeError, match="non-finite"):
        odeint_grassmann(blows_up, Y0, 0.0, t0=0.6)
    with pytest.raises(RuntimeError, match="underflow.*non-finite"):
        odeint_grassmann(blows_up, Y0, 0.0)


def test_dopri5_tableau_order_conditions():
    """The shared tableau satisfies the order conditions of a 5(4) pair, in exact rationals
    where they are written so: a mistyped coefficient (which would silently make both
    solvers low order) breaks one of them."""
    from fractions import Fraction

    from grassflow.ode import dopri5

    A = [[Fraction(a).limit_denominator(10**6) for a in row] for row in dopri5.A]
    C = [Fraction(c).limit_denominator(10**6) for c in dopri5.C]
    B = [Fraction(b).limit_denominator(10**6) for b in dopri5.B]
    B4 = [b - Fraction(e).limit_denominator(10**7) for b, e in zip(B, dopri5.E)]
    for i in range(1, 7):
        assert sum(A[i]) == C[i]
    for w, order in ((B, 5), (B4, 4)):
        for q in range(1, order + 1):  # quadrature conditions sum b_i c_i^(q-1) = 1/q
            assert sum(b * c ** (q - 1) for b, c in zip(w, C)) == Fraction(1, q)
    # one tree of order 3 and one of order 4 beyond quadrature: sum b_i a_ij c_j = 1/6, ...
    Ac = [sum(a * C[j] for j, a in enumerate(row)) for row in A]
    assert sum(b * x for b, x in zip(B, Ac)) == Fraction(1, 6)
    assert sum(b * c * x for b, c, x in zip(B, C, Ac)) == Fraction(1, 8)
