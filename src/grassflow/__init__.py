"""grassflow: continuous normalizing flows on Grassmann manifolds (GrCNF)."""

from .distributions import MatrixGaussianPrior, UniformGrassmann
from .manifolds import Grassmann

__all__ = ["Grassmann", "MatrixGaussianPrior", "UniformGrassmann"]
__version__ = "0.1.0"
