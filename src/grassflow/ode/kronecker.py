r"""Paper-faithful reference solver: DOPRI5 in Cayley-retraction coordinates, Kronecker Jacobians.

The paper (Appendix "Details on ODE Solver with Orthogonal Integration") writes the solution
near the current point Y as ``gamma(t) = R_Y(xi(t))``, with R the Cayley retraction
(`Grassmann.retr`), and integrates the chart ODE

$$
\frac{d\,\mathrm{vec}\,\xi}{dt} = \nabla_\gamma \overline{R}_Y^{-1}\,
\mathrm{vec}\,X(t, \gamma(t))
$$

with one DOPRI5 step, then re-centres ``Y <- R_Y(xi)``, ``xi <- 0``. The Jacobian of the inverse
retraction ``R_Y^{-1}(X) = 2 M N^{-1}`` (eq. 38, `Grassmann.inv_retr`) is built as
explicit Dk x Dk matrices (column-major vec):

    J = 2 (N^{-T} (x) I_D) dM + 2 (I_k (x) M) dN^{-1},
    dM = I_Dk - I_k (x) Y Y^T,   dN^{-1} = -(N^{-T} (x) N^{-1}) (I_k (x) Y^T),

with ``M = X - Y Y^T X`` and ``N = I_k + Y^T X`` (`inv_retr_jacobian`). Two deviations
from the printed text, both needed for a correct answer and checked in tests/test_kronecker.py:

* The paper prints ``M = Y - X X^T Y``, ``N = I_k + X^T Y`` (and X in dM, dN^{-1}): that is the
  derivative of ``R_X^{-1}(Y)`` in Y, i.e. with the base point and the moving point swapped.
  Both agree at ``X = Y`` (the horizontal projector), but inside a step they differ by
  O(|xi|): the scheme becomes first order (measured on Gr(3, 6): 0.07 nats at tol 1e-9).
* For k > 1 the chart only sees the section ``S = {Z : Y^T Z symmetric}`` of St(k, D) (the
  image of R_Y); the horizontal lift of the flow leaves S. We therefore integrate
  ``Z = R_Y(xi)`` with ``dZ/dt = V + Z Omega``, ``V = X(gamma) Rot^T``, where the skew k x k
  Omega keeps ``Y^T Z`` symmetric (a Kronecker-form Lyapunov solve), and carry the rotation
  ``gamma = Z Rot``, ``Rot = cay(rho)``, ``drho/dt = -(I - rho/2) Omega (I + rho/2)``. Then
  gamma is exactly the horizontal lift, so the returned representatives match the other
  methods'. Omega = O(|xi|), so dropping it still converges, but only at about third order.

Cost per stage: forming J as the printed product ``(N^{-T} (x) I_D) dM`` is a dense
(Dk)x(Dk) matrix product, O(D^3 k^3) time and O(D^2 k^2) memory per point (applying J alone is
O(D^2 k^2)); the default `grassflow.ode.rkmk` solver works with D x 12k factors in
O(D k^2). This module is the baseline for benchmarks and tests, not for training.

The step-size controller, error norm, initial step and FSAL reuse of the dynamics are those of
`grassflow.ode.rkmk.solve_cayley_rkmk`, so NFE and accuracy are directly comparable.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation.
    NeurIPS 2023, arXiv:2211.02900, Appendix (eq. of the derivative of the inverse retraction).
    Magnus, Neudecker. Matrix Differential Calculus (2019), ch. 9-10 (vec and Kronecker rules).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..manifolds import Grassmann
from .dopri5 import A, B, C, Dynamics, E, stage_time
from .rkmk import adaptive_dopri5

__all__ = ["inv_retr_jacobian", "kron", "solve_kronecker", "vec"]


def kron(A: Tensor, B: Tensor) -> Tensor:
    """``torch.kron`` of the last two dims, batched: ``(..., m, n), (..., p, q) -> (..., mp, nq)``.

    ``torch.kron`` itself would also take the Kronecker product of the batch dimensions.
    """
    m, n = A.shape[-2:]
    p, q = B.shape[-2:]
    out = A[..., :, None, :, None] * B[..., None, :, None, :]
    return out.reshape(*out.shape[:-4], m * p, n * q)


def vec(X: Tensor) -> Tensor:
    """Column-stacking vec, ``(..., D, k) -> (..., D k)``: ``vec(AXB) = (B^T (x) A) vec X``."""
    return X.mT.reshape(*X.shape[:-2], -1)


def _unvec(v: Tensor, D: int, k: int) -> Tensor:
    return v.reshape(*v.shape[:-1], k, D).mT


def inv_retr_jacobian(Y: Tensor, X: Tensor) -> Tensor:
    """Jacobian of ``X -> vec R_Y^{-1}(X)`` with Kronecker products (paper's formula, X and Y in
    the roles of base point and moving point; see the module docstring).

    Args:
        Y: ``(..., D, k)`` chart centre (base point).
        X: ``(..., D, k)`` point where the Jacobian is taken (any matrix with ``I + Y^T X``
            invertible).

    Returns:
        ``(..., D k, D k)`` with ``vec dxi = J vec dX``.
    """
    D, k = Y.shape[-2:]
    eye_k = torch.eye(k, dtype=Y.dtype, device=Y.device)
    eye_D = torch.eye(D, dtype=Y.dtype, device=Y.device)
    eye_Dk = torch.eye(D * k, dtype=Y.dtype, device=Y.device)
    N_inv = torch.linalg.inv(eye_k + Y.mT @ X)
    M = X - Y @ (Y.mT @ X)
    dM = eye_Dk - kron(eye_k, Y @ Y.mT)
    dN_inv = -kron(N_inv.mT, N_inv) @ kron(eye_k, Y.mT)
    return 2.0 * kron(N_inv.mT, eye_D) @ dM + 2.0 * kron(eye_k, M) @ dN_inv


def _cay(rho: Tensor) -> Tensor:
    eye = torch.eye(rho.shape[-1], dtype=rho.dtype, device=rho.device)
    return torch.linalg.solve(eye - 0.5 * rho, eye + 0.5 * rho)


def _rates(Y: Tensor, Z: Tensor, rho: Tensor, Rot: Tensor, X: Tensor) -> tuple[Tensor, Tensor]:
    """Chart velocities ``(dxi/dt, drho/dt)`` at ``gamma = Z Rot`` where the dynamics gave X."""
    D, k = Y.shape[-2:]
    eye_k = torch.eye(k, dtype=Y.dtype, device=Y.device)
    V = X @ Rot.mT
    # gauge: skew Omega with P Omega + Omega P = W^T - W keeps Y^T Z symmetric (Z stays in S)
    P, W = Y.mT @ Z, Y.mT @ V
    lyap = kron(eye_k, P) + kron(P.mT, eye_k)
    Omega = _unvec(torch.linalg.solve(lyap, vec(W.mT - W).unsqueeze(-1)).squeeze(-1), k, k)
    dxi = inv_retr_jacobian(Y, Z) @ vec(V + Z @ Omega).unsqueeze(-1)
    drho = -(eye_k - 0.5 * rho) @ Omega @ (eye_k + 0.5 * rho)
    return _unvec(dxi.squeeze(-1), D, k), drho


def _step(dynamics: Dynamics, gr: Grassmann, t: float, t_end: float, h: float, Y, a, X, r):
    """One DOPRI5 step of signed size h in the chart at Y; ``(X, r)`` are the dynamics at Y.

    Returns ``(Y_new, a_new, X_new, r_new, err_Y, err_a)`` like `rkmk._step`; the point
    error is ``err_xi + Y err_rho``, the first-order displacement of the point.
    """
    eye = torch.eye(Y.shape[-1], dtype=Y.dtype, device=Y.device)
    ks, rs = [_rates(Y, Y, torch.zeros_like(eye), eye, X)], [r]
    for i in range(1, 7):
        xi = h * sum(c * kx for c, (kx, _) in zip(A[i], ks) if c != 0.0)
        rho = h * sum(c * kr for c, (_, kr) in zip(A[i], ks) if c != 0.0)
        Z, Rot = gr.retr(Y, xi), _cay(rho)
        Xi, ri = dynamics(stage_time(t_end if C[i] == 1.0 else t + C[i] * h, Y), Z @ Rot)
        ks.append(_rates(Y, Z, rho, Rot, Xi))  # the 7th only enters the error estimate
        rs.append(ri)
    Y_new = Z @ Rot  # row 7 of A is B: the last stage is the 5th-order solution
    a_new = a + h * sum(b * rj for b, rj in zip(B, rs) if b != 0.0)
    with torch.no_grad():
        err_xi = h * sum(e * kx for e, (kx, _) in zip(E, ks) if e != 0.0)
        err_rho = h * sum(e * kr for e, (_, kr) in zip(E, ks) if e != 0.0)
        err_Y = err_xi + Y @ err_rho
        err_a = h * sum(e * rj for e, rj in zip(E, rs) if e != 0.0)
    return Y_new, a_new, Xi, ri, err_Y, err_a


def solve_kronecker(
    dynamics: Dynamics,
    Y0: Tensor,
    a0: Tensor,
    t0: float,
    t1: float,
    **options,
) -> tuple[Tensor, Tensor, dict]:
    """Adaptive DOPRI5 in re-centred Cayley charts from t0 to t1 (either direction). Inputs are
    validated by `grassflow.ode.odeint_grassmann`, which documents the arguments.

    Controller, error norm and statistics are those of `solve_cayley_rkmk`
    (the shared `adaptive_dopri5`); each accepted
    step re-centres the chart at the new point (xi, rho <- 0); backprop goes through the
    accepted steps.
    """
    gr = Grassmann(Y0.shape[-1], Y0.shape[-2])

    def step(t, t_end, h, Y, a, X, r):
        return _step(dynamics, gr, t, t_end, h, Y, a, X, r)

    return adaptive_dopri5(step, "kronecker", dynamics, Y0, a0, t0, t1, **options)
