"""The Dormand-Prince 5(4) tableau and step-size controller constants, shared by the
Grassmann solvers (`rkmk`, `kronecker`).

References:
    Dormand, Prince. A family of embedded Runge-Kutta formulae. J. Comput. Appl. Math. 6
    (1980).
    Hairer, Norsett, Wanner. Solving Ordinary Differential Equations I (1993), Sec. II.4.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["A", "B", "C", "E", "MAX_FACTOR", "MIN_FACTOR", "ORDER", "SAFETY", "Dynamics",
           "stage_time"]  # fmt: skip

Dynamics = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""``dynamics(t, Y) -> (X, r)``: the velocity ``X: (..., D, k)`` and the accumulator's rate
``r: (...)`` (e.g. minus the divergence)."""

# Dormand-Prince 5(4). Row 7 of A equals the 5th-order weights B (first same as last), so the
# 7th stage is the new point and its evaluation is reused as stage 1 of the next step.
C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
B = A[6] + (0.0,)
# B minus the 4th-order weights, written exactly rather than subtracted in floating point
E = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)
ORDER = 5
SAFETY, MIN_FACTOR, MAX_FACTOR = 0.9, 0.2, 10.0


def stage_time(t: float, like: Tensor) -> Tensor:
    """``t`` as a 0-dim tensor of ``like``'s dtype and device (what the dynamics receive)."""
    return torch.tensor(t, dtype=like.dtype, device=like.device)
