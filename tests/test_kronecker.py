"""Tests for grassflow.ode.kronecker, the paper-faithful chart solver with Kronecker Jacobians.

References: autograd Jacobians of ``Grassmann.inv_retr`` and ``Grassmann.retr`` for the formula,
and the two other solvers (low-rank Cayley RKMK, projected ambient dopri5) for the flow.
"""

from __future__ import annotations

import pytest
import torch

from grassflow.flows import GrCNF
from grassflow.manifolds import Grassmann, orthonormality_error
from grassflow.nn import GrassmannField, Potential, scale_init_
from grassflow.ode import inv_retr_jacobian, odeint_grassmann
from grassflow.ode.kronecker import _cay, _rates, kron, vec

TIGHT = {"atol": 1e-8, "rtol": 1e-8}
CASES = [(1, 3), (2, 4)]


def autograd_jacobian(fn, X: torch.Tensor) -> torch.Tensor:
    """``d vec fn(X) / d vec X`` for one ``X: (D, k)``, column-major vec like the module."""
    D, k = X.shape
    return torch.autograd.functional.jacobian(lambda v: vec(fn(v.reshape(k, D).mT)), vec(X))


def make_flow(k: int, D: int, field=None, **kwargs) -> GrCNF:
    if field is None:
        field = scale_init_(GrassmannField(Potential(D, k, (8, 8))), 2.0)
    return GrCNF(Grassmann(k, D), field, **{**TIGHT, **kwargs}).eval()


def test_batched_kron_matches_torch_kron():
    A, B = torch.randn(2, 3, 4, 2), torch.randn(3, 5, 3)
    out = kron(A, B)
    assert out.shape == (2, 3, 20, 6)
    assert torch.equal(out[1, 2], torch.kron(A[1, 2], B[2]))


@pytest.mark.parametrize("k,D", [(1, 3), (2, 4), (3, 7)])
def test_inv_retr_jacobian_matches_autograd(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(3)
    on_chart = gr.retr(Y, gr.proju(Y, 0.7 * torch.randn(3, D, k)))
    generic = Y + 0.3 * torch.randn(3, D, k)  # the formula holds off the manifold too
    for X in (on_chart, generic, Y):
        J = inv_retr_jacobian(Y, X)
        assert J.shape == (3, D * k, D * k)
        for i in range(3):
            ref = autograd_jacobian(lambda Z, i=i: gr.inv_retr(Y[i], Z), X[i])
            torch.testing.assert_close(J[i], ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("k,D", [(1, 3), (2, 5)])
def test_printed_formula_has_base_point_and_moving_point_swapped(k, D):
    # the paper prints M = Y - X X^T Y, N = I + X^T Y: the derivative of R_X^{-1}(Y) in Y
    gr = Grassmann(k, D)
    Y = gr.random(2)
    X = gr.retr(Y, gr.proju(Y, 0.5 * torch.randn(2, D, k)))
    printed = inv_retr_jacobian(X, Y)
    needed = inv_retr_jacobian(Y, X)
    assert (printed - needed).abs().max() > 0.05
    # at the chart centre both reduce to the horizontal projector I - I_k (x) Y Y^T
    proj = torch.eye(D * k) - kron(torch.eye(k), Y @ Y.mT)
    torch.testing.assert_close(inv_retr_jacobian(Y, Y), proj, atol=1e-14, rtol=0)


@pytest.mark.parametrize("k,D", [(2, 4), (3, 6)])
def test_jacobian_inverts_the_retraction_differential(k, D):
    gr = Grassmann(k, D)
    Y = gr.random(2)
    xi = gr.proju(Y, 0.6 * torch.randn(2, D, k))
    eta = gr.proju(Y, torch.randn(2, D, k))
    X, dX = torch.func.jvp(lambda v: gr.retr(Y, v), (xi,), (eta,))
    back = inv_retr_jacobian(Y, X) @ vec(dX).unsqueeze(-1)
    torch.testing.assert_close(back.squeeze(-1), vec(eta), atol=1e-12, rtol=0)


@pytest.mark.parametrize("k,D", [(1, 3), (3, 6)])
def test_chart_velocity_moves_the_point_along_the_field(k, D):
    # gamma = R_Y(xi) cay(rho) must move with velocity X(gamma), vertical part included
    gr = Grassmann(k, D)
    Y = gr.random(2)
    xi = gr.proju(Y, 0.5 * torch.randn(2, D, k))
    A = 0.3 * torch.randn(2, k, k)
    rho = A - A.mT
    Z, Rot = gr.retr(Y, xi), _cay(rho)
    X = torch.randn(2, D, k)
    X = X - Z @ Rot @ (0.5 * ((Z @ Rot).mT @ X + X.mT @ (Z @ Rot)))  # tangent to St at gamma
    dxi, drho = _rates(Y, Z, rho, Rot, X)
    torch.testing.assert_close(gr.proju(Y, dxi), dxi, atol=1e-12, rtol=0)  # horizontal at Y
    _, velocity = torch.func.jvp(lambda a, b: gr.retr(Y, a) @ _cay(b), (xi, rho), (dxi, drho))
    torch.testing.assert_close(velocity, X, atol=1e-12, rtol=0)


@pytest.mark.parametrize("k,D", CASES)
def test_log_prob_agrees_with_the_other_solvers(k, D):
    rkmk = make_flow(k, D)
    Y = rkmk.manifold.random(6)
    with torch.no_grad():
        ref = rkmk.log_prob(Y)
        for method in ("ambient", "kronecker"):
            lp = make_flow(k, D, field=rkmk.field, method=method).log_prob(Y)
            torch.testing.assert_close(lp, ref, atol=1e-6, rtol=0, msg=method)


@pytest.mark.parametrize("k,D", CASES)
def test_transported_samples_agree_and_stay_orthonormal(k, D):
    rkmk = make_flow(k, D)
    kronecker = make_flow(k, D, field=rkmk.field, method="kronecker")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        Y0 = rkmk.sample_prior(5, gen)
        Y1 = kronecker.transport_forward(Y0)
        assert kronecker.last_stats["steps"] > 3
        # the rotation rho makes the chart path return the horizontal lift, as RKMK does
        torch.testing.assert_close(Y1, rkmk.transport_forward(Y0), atol=1e-7, rtol=0)
        assert orthonormality_error(Y1).max() < 1e-12
        Yb = kronecker.transport_backward(Y1)
        torch.testing.assert_close(Yb, Y0, atol=1e-7, rtol=0)


def test_gradients_match_rkmk():
    k, D = 2, 4
    rkmk = make_flow(k, D)
    kronecker = make_flow(k, D, field=rkmk.field, method="kronecker")
    Y = rkmk.manifold.random(4)
    # each model has its own end time sqrt_T; the field is shared
    grads = [
        torch.autograd.grad(m.log_prob(Y).mean(), list(m.parameters())) for m in (rkmk, kronecker)
    ]
    for g_rkmk, g_kron in zip(*grads):
        torch.testing.assert_close(g_kron, g_rkmk, atol=1e-7, rtol=1e-6)


def test_bad_method_names_and_adjoint():
    gr = Grassmann(1, 3)
    Y = gr.random(2)
    oja = lambda t, Y: (gr.proju(Y, Y.flip(-2)), Y.new_zeros(Y.shape[:-2]))
    with pytest.raises(ValueError, match="method must be one of"):
        odeint_grassmann(oja, Y, 0.0, method="Kronecker")
    with pytest.raises(ValueError, match="method must be one of"):
        GrCNF(gr, method="kron")
    with pytest.raises(ValueError, match="adjoint"):
        odeint_grassmann(oja, Y, 0.0, method="kronecker", adjoint=True)
    with pytest.raises(ValueError, match="adjoint"):
        GrCNF(gr, method="kronecker", adjoint=True)
