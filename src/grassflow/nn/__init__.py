"""Neural networks for GrCNF: HorP, ConcatSquash, potentials (the paper's MLP and a
permutation-invariant graph), the equivariant gradient field, and the Gram density."""

from .field import PRESETS, GrassmannField, Potential
from .graph import GraphPotential, PointGraph
from .layers import ConcatSquash, HorP, scale_init_

__all__ = [
    "PRESETS", "ConcatSquash", "GrassmannField", "GraphPotential", "HorP", "PointGraph",
    "Potential", "scale_init_",
]  # fmt: skip
