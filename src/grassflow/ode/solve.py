"""Public entry point: solve an ODE on Gr(k, D) together with a scalar accumulator."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..manifolds import Grassmann
from .ambient import solve_ambient
from .kronecker import solve_kronecker
from .rkmk import solve_cayley_rkmk

__all__ = ["METHODS", "odeint_grassmann"]

METHODS = ("cayley_rkmk", "ambient", "kronecker")


def _as_time(t, name: str) -> float:
    if isinstance(t, Tensor):
        if t.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(t.shape)}")
        t = t.item()
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {t!r}") from None
    if not math.isfinite(t):
        raise ValueError(f"{name} must be finite, got {t}")
    return t


def _as_accumulator(a0, Y0: Tensor) -> Tensor:
    batch = Y0.shape[:-2]
    a0 = torch.as_tensor(a0, device=Y0.device)
    if not a0.is_floating_point():
        a0 = a0.to(Y0.dtype)
    if a0.dim() == 0:
        a0 = a0.expand(batch)
    elif a0.shape != batch:
        raise ValueError(
            f"a0 must be a scalar or have the batch shape {tuple(batch)} of Y0 "
            f"{tuple(Y0.shape)}, got {tuple(a0.shape)}"
        )
    if not torch.isfinite(a0).all():
        raise ValueError("a0 contains NaN or inf")
    return a0.to(Y0.dtype)


def odeint_grassmann(
    dynamics: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    Y0: Tensor,
    a0: Tensor | float,
    t0: float = 0.0,
    t1: float = 1.0,
    *,
    method: str = "cayley_rkmk",
    atol: float = 1e-5,
    rtol: float = 1e-5,
    adjoint: bool = False,
    adjoint_params: tuple[Tensor, ...] | None = None,
    max_steps: int = 10_000,
    first_step: float | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Solve ``dY/dt = X(t, Y)``, ``da/dt = r(t, Y)`` on Gr(k, D) from t0 to t1.

    The accumulator a carries a scalar per point, e.g. the log-density change
    ``-int div X dt`` of a continuous normalizing flow (paper eq. 9). Backprop through the
    solver reaches Y0, a0 and every tensor the dynamics uses, for both methods.

    Args:
        dynamics: ``dynamics(t, Y) -> (X, r)`` with t a 0-dim tensor of Y's dtype,
            ``Y: (..., D, k)`` orthonormal, ``X: (..., D, k)`` horizontal (``Y^T X = 0``) and
            ``r: (...)``. For O(k)-equivariant dynamics (``X(YQ) = X(Y) Q``, ``r(YQ) = r(Y)``)
            the solution is equivariant too. A vertical part ``Y M`` of X only rotates the
            representative within its subspace. Under ``"ambient"``, t can carry autograd
            history from torchdiffeq's step-size choice; use ``t.item()``, not ``float(t)``.
        Y0: ``(..., D, k)`` orthonormal initial representatives (``1 <= k < D``).
        a0: ``(...)`` initial accumulator, or a scalar broadcast to the batch.
        t0: start time.
        t1: end time; ``t1 < t0`` integrates backward.
        method: ``"cayley_rkmk"`` (intrinsic DOPRI5 Runge-Kutta-Munthe-Kaas with the Cayley
            map, orthonormal to rounding error; `grassflow.ode.rkmk`), ``"ambient"``
            (torchdiffeq dopri5 on the ambient matrix with Newton-Schulz projection;
            `grassflow.ode.ambient`) or ``"kronecker"`` (the paper's dopri5 in re-centred
            Cayley charts with explicit Dk x Dk Kronecker Jacobians, a slow reference;
            `grassflow.ode.kronecker`).
        atol: absolute error tolerance; one step size serves the whole batch.
        rtol: relative error tolerance (as atol).
        adjoint: ``method="ambient"`` only: gradients by torchdiffeq's adjoint method, in
            O(1) memory, to Y0, a0 and ``adjoint_params``.
        adjoint_params: the tensors that ``dynamics`` depends on and that need gradients
            under ``adjoint=True``; default ``dynamics.parameters()`` if it is an
            ``nn.Module``. Tensors left out silently get no gradient.
        max_steps: limit on attempted (accepted plus rejected) steps.
        first_step: size of the first attempted step; default Hairer's automatic choice.

    Returns:
        ``(Y1, a1, stats)``: ``Y1: (..., D, k)``, ``a1: (...)`` and
        ``stats = {"nfe", "steps", "rejected"}`` (forward dynamics evaluations, accepted and
        rejected steps).

    Raises:
        ValueError: unknown method, bad shapes, non-finite or non-orthonormal Y0, bad
            tolerances, ``adjoint=True`` with a method other than ``"ambient"``.
        RuntimeError: max_steps exceeded, step-size underflow, or non-finite dynamics.

    Example:
        >>> gr = Grassmann(2, 5)
        >>> C = torch.randn(5, 5, dtype=torch.float64); C = C + C.T
        >>> def oja(t, Y):  # gradient flow of tr(Y^T C Y) / 2
        ...     return gr.proju(Y, C @ Y), torch.einsum("...ij,ik,...kj->...", Y, C, Y)
        >>> Y1, a1, stats = odeint_grassmann(oja, gr.random(8, dtype=torch.float64), 0.0)
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not callable(dynamics):
        raise ValueError(f"dynamics must be callable, got {type(dynamics).__name__}")
    if not isinstance(Y0, Tensor) or Y0.dim() < 2:
        shape = tuple(Y0.shape) if isinstance(Y0, Tensor) else type(Y0).__name__
        raise ValueError(f"Y0 must be a tensor of shape (..., D, k), got {shape}")
    D, k = Y0.shape[-2:]
    if not 1 <= k < D:
        raise ValueError(f"Y0 must have shape (..., D, k) with 1 <= k < D, got {tuple(Y0.shape)}")
    Grassmann(k, D).check_point(Y0, name="Y0")
    a0 = _as_accumulator(a0, Y0)
    t0, t1 = _as_time(t0, "t0"), _as_time(t1, "t1")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {tol!r}")
    if atol == 0 and rtol == 0:
        raise ValueError("atol and rtol cannot both be zero")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if first_step is not None and not (math.isfinite(first_step) and first_step > 0):
        raise ValueError(f"first_step must be a finite number > 0, got {first_step!r}")
    common = {"atol": atol, "rtol": rtol, "max_steps": max_steps, "first_step": first_step}

    if method != "ambient" and adjoint:
        raise ValueError("adjoint=True is only available with method='ambient'")
    if method == "cayley_rkmk":
        return solve_cayley_rkmk(dynamics, Y0, a0, t0, t1, **common)
    if method == "kronecker":
        return solve_kronecker(dynamics, Y0, a0, t0, t1, **common)
    if adjoint:
        if adjoint_params is None:
            if not isinstance(dynamics, nn.Module):
                raise ValueError(
                    "adjoint=True needs adjoint_params (the tensors dynamics depends on) unless "
                    "dynamics is an nn.Module; pass adjoint_params=() if there are none"
                )
            adjoint_params = tuple(dynamics.parameters())
        adjoint_params = tuple(adjoint_params)
    else:
        adjoint_params = ()
    return solve_ambient(
        dynamics, Y0, a0, t0, t1, adjoint=adjoint, adjoint_params=adjoint_params, **common
    )
