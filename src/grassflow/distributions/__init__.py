"""Densities on Gr(k, D) as ``torch.distributions.Distribution`` objects.

Every ``log_prob`` in grassflow is a density with respect to the Riemannian volume of
Gr(k, D) under the quotient metric ``tr(xi^T eta)``: the uniform distribution has
``log_prob = -log V_Gr(k, D)`` and every density integrates to one.
"""

from .harmonic import MatrixAngularCentralGaussian, bond_laplacian, harmonic_covariance
from .matrix_gaussian import MatrixGaussianPrior, check_covariance
from .uniform import UniformGrassmann

__all__ = ["MatrixAngularCentralGaussian", "MatrixGaussianPrior", "UniformGrassmann",
           "bond_laplacian", "check_covariance", "harmonic_covariance"]  # fmt: skip
