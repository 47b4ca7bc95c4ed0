"""ODE integrators and divergences on Gr(k, D) for points ``Y: (..., D, k)``.

`odeint_grassmann` is the entry point; ``method`` picks the intrinsic Cayley
Runge-Kutta-Munthe-Kaas solver, the projected ambient torchdiffeq solver, or the paper's
Kronecker-product chart solver (a slow reference).
"""

from .ambient import polar_newton_schulz
from .divergence import (
    divergence_exact,
    divergence_hutchinson,
    horizontal_basis,
    horizontal_frame,
    horizontal_noise,
)
from .kronecker import inv_retr_jacobian
from .rkmk import cayley_lowrank
from .solve import METHODS, odeint_grassmann

__all__ = [
    "METHODS",
    "cayley_lowrank",
    "divergence_exact",
    "divergence_hutchinson",
    "horizontal_basis",
    "horizontal_frame",
    "horizontal_noise",
    "inv_retr_jacobian",
    "odeint_grassmann",
    "polar_newton_schulz",
]
