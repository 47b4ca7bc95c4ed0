"""Neural networks for GrCNF: HorP, ConcatSquash, potentials (the paper's MLP and a
permutation-invariant graph), the equivariant gradient field with its forward-Laplacian
divergence (`jet`), and the EGNN velocity field on point clouds."""

from .egnn import EGNNField
from .field import LAPLACIANS, PAPER_WIDTHS, GrassmannField, Potential
from .graph import GraphPotential, PointGraph
from .jet import Jet
from .layers import ConcatSquash, HorP, scale_init_

__all__ = [
    "LAPLACIANS", "PAPER_WIDTHS", "ConcatSquash", "EGNNField", "GrassmannField", "GraphPotential",
    "HorP", "Jet", "PointGraph", "Potential", "scale_init_",
]  # fmt: skip
