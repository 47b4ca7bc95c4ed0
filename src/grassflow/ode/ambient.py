"""Ambient integration with projection: torchdiffeq's dopri5 on ``(Y, a)`` in R^{D x k} x R.

The vector field is extended off the manifold by evaluating the dynamics at the projected
point, ``f(t, Y) = dynamics(t, pi(Y))``, and the answer is ``pi(Y(t1))``. Along the exact
flow ``Y^T Y`` stays the identity, so the numerical state drifts off the manifold only by
the integration error; ``pi`` removes that drift. This is the baseline that the intrinsic
Cayley-RKMK solver (`grassflow.ode.rkmk`) is compared with, and it gives access to
torchdiffeq's adjoint method.

References:
    Hairer, Lubich, Wanner. Geometric Numerical Integration (2006), Sec. IV.4 (projection).
    Chen, Rubanova, Bettencourt, Duvenaud. Neural Ordinary Differential Equations (2018).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torchdiffeq import odeint, odeint_adjoint

__all__ = ["polar_newton_schulz", "solve_ambient"]

# From a defect |Y^T Y - I| <= 0.1 the iteration reaches float64 rounding in 5 steps.
_NS_ITERS = 5


def polar_newton_schulz(Y: Tensor, iters: int = _NS_ITERS) -> Tensor:
    """Polar factor ``Y (Y^T Y)^{-1/2}`` of a near-orthonormal ``Y: (..., D, k)``.

    Newton-Schulz iteration ``Y <- Y (3 I - Y^T Y) / 2``: with ``Y^T Y = I + E`` the new
    defect is ``-3/4 E^2 + 1/4 E^3``, so convergence is quadratic for singular values in
    ``(0, sqrt 3)``. It uses only matrix products, so its backward pass is bounded near
    orthonormal matrices, where ``eigh``/``svd`` backward divides by vanishing eigenvalue
    gaps. Equivariant: ``pi(Y Q) = pi(Y) Q`` for Q in O(k).

    Args:
        Y: ``(..., D, k)`` with ``Y^T Y`` close to the identity.
        iters: number of iterations.

    Returns:
        ``(..., D, k)`` orthonormal up to ``|Y^T Y - I|^(2^iters)``.
    """
    eye = torch.eye(Y.shape[-1], dtype=Y.dtype, device=Y.device)
    for _ in range(iters):
        Y = Y @ (1.5 * eye - 0.5 * (Y.mT @ Y))
    return Y


class _AmbientField(nn.Module):
    """``(t, (Y, a)) -> dynamics(t, pi(Y))``, counting evaluations and torchdiffeq's steps.

    An ``nn.Module`` dynamics becomes a submodule, so torchdiffeq can find its parameters.
    """

    def __init__(self, dynamics: Callable, dtype: torch.dtype):
        super().__init__()
        self.dynamics = dynamics
        self.dtype = dtype
        self.nfe = self.steps = self.rejected = 0

    def forward(self, t: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        Y, a = state
        # torchdiffeq keeps time in float64. Its step sizes carry autograd history (they are
        # computed from the state); detaching t here would make the gradient inconsistent.
        X, r = self.dynamics(t.to(self.dtype), polar_newton_schulz(Y))
        if self.nfe == 0 and (X.shape != Y.shape or r.shape != a.shape):
            raise ValueError(
                f"dynamics must return X of shape {tuple(Y.shape)} and r of shape "
                f"{tuple(a.shape)}, got {tuple(X.shape)} and {tuple(r.shape)}"
            )
        self.nfe += 1
        return X, r

    # torchdiffeq calls these on the forward solve (not on the adjoint solve)
    def callback_accept_step(self, t0, y0, dt) -> None:
        self.steps += 1

    def callback_reject_step(self, t0, y0, dt) -> None:
        self.rejected += 1


def solve_ambient(
    dynamics: Callable,
    Y0: Tensor,
    a0: Tensor,
    t0: float,
    t1: float,
    *,
    atol: float,
    rtol: float,
    max_steps: int,
    first_step: float | None,
    adjoint: bool,
    adjoint_params: tuple[Tensor, ...],
) -> tuple[Tensor, Tensor, dict]:
    """Projected ambient dopri5 from t0 to t1. Inputs are validated by
    `grassflow.ode.odeint_grassmann`, which documents the arguments.

    ``stats['nfe']`` counts forward evaluations only; the adjoint's backward solve runs later.
    """
    field = _AmbientField(dynamics, Y0.dtype)
    if t0 == t1:
        return Y0, a0, {"nfe": 0, "steps": 0, "rejected": 0}
    t = torch.tensor([t0, t1], dtype=torch.float64, device=Y0.device)
    options = {"max_num_steps": max_steps}
    if first_step is not None:
        options["first_step"] = first_step
    kwargs = {"rtol": rtol, "atol": atol, "method": "dopri5", "options": options}
    try:
        if adjoint:
            Ys, As = odeint_adjoint(field, (Y0, a0), t, adjoint_params=adjoint_params, **kwargs)
        else:
            Ys, As = odeint(field, (Y0, a0), t, **kwargs)
    except AssertionError as err:
        # torchdiffeq reports max_num_steps, dt underflow and non-finite states by assert
        raise RuntimeError(f"ambient dopri5 failed: {str(err)[:200]}") from err
    stats = {"nfe": field.nfe, "steps": field.steps, "rejected": field.rejected}
    return polar_newton_schulz(Ys[-1]), As[-1], stats
