"""grassflow: continuous normalizing flows on Grassmann manifolds (GrCNF).

Points of Gr(k, D) are orthonormal representatives ``Y: (..., D, k)``; every ``log_prob`` is a
density with respect to the Riemannian volume of Gr(k, D) under the metric ``tr(xi^T eta)``.
The shape model for point clouds is `ShapeFlow`, one E(n)-equivariant flow on the cloud; a
molecule with a bond graph also has `InternalFlow`, in bonds, angles and torsions.
"""

import os as _os
import sys as _sys

if "torch" not in _sys.modules:
    # OpenMP threads that spin while they wait stall each other when the machine is busy
    # (grassflow.training.threads); sleeping costs little. libgomp reads this when torch loads.
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ._malloc import configure as _configure_malloc
from .distributions import MatrixGaussianPrior, UniformGrassmann
from .flows import GrCNF, InternalFlow, InternalFlowConfig, ShapeFlow, ShapeFlowConfig
from .manifolds import Grassmann
from .nn import GrassmannField, Potential
from .ode import odeint_grassmann

__all__ = [
    "GrCNF",
    "Grassmann",
    "GrassmannField",
    "InternalFlow",
    "InternalFlowConfig",
    "MatrixGaussianPrior",
    "Potential",
    "ShapeFlow",
    "ShapeFlowConfig",
    "UniformGrassmann",
    "odeint_grassmann",
    "__version__",
]
__version__ = "0.2.0.dev0"

# glibc only: keep torch's large temporaries in the heap instead of giving them back to the
# kernel at every ODE step (system time was over half the CPU time); GRASSFLOW_MALLOC=default
# turns it off. Why and what it costs: grassflow/_malloc.py, docs/performance.md.
_configure_malloc()
