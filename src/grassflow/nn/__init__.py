"""Neural networks for GrCNF: HorP, ConcatSquash, potentials (the paper's MLP and a
permutation-invariant graph), the equivariant gradient field with its forward-Laplacian
divergence (:mod:`.jet`), and the Gram density."""

from .field import LAPLACIANS, PRESETS, GrassmannField, Potential
from .graph import GraphPotential, PointGraph
from .jet import Jet
from .layers import ConcatSquash, HorP, scale_init_

__all__ = [
    "LAPLACIANS", "PRESETS", "ConcatSquash", "GrassmannField", "GraphPotential", "HorP", "Jet",
    "PointGraph", "Potential", "scale_init_",
]  # fmt: skip
