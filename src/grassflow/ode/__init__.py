"""ODE integrators and divergences on Gr(k, D) for points ``Y: (..., D, k)``.

:func:`odeint_grassmann` is the entry point; ``method`` picks the intrinsic Cayley
Runge-Kutta-Munthe-Kaas solver or the projected ambient torchdiffeq solver.
"""

from .ambient import polar_newton_schulz
from .divergence import divergence_exact, divergence_hutchinson, horizontal_basis, horizontal_noise
from .rkmk import cayley_lowrank
from .solve import METHODS, odeint_grassmann

__all__ = [
    "METHODS",
    "cayley_lowrank",
    "divergence_exact",
    "divergence_hutchinson",
    "horizontal_basis",
    "horizontal_noise",
    "odeint_grassmann",
    "polar_newton_schulz",
]
