"""Comparators that users can run too: models from the literature, on the same data,
coordinates and training loop as ours, so that a comparison measures the models.

`EquivariantCNF` is the E(n)-equivariant CNF trained by flow matching (EFM; Klein,
Krämer & Noé 2023), the model people use today for point-cloud densities.
"""

from ..nn.egnn import EGNNField
from .equivariant_cnf import EquivariantCNF, ShapeFlowConfig
from .fit import fit_equivariant_cnf, load_equivariant_cnf
from .matching import CFM_COUPLINGS, align, cfm_losses, cfm_objective, orthogonal_cost, procrustes

__all__ = [
    "CFM_COUPLINGS", "EGNNField", "EquivariantCNF", "ShapeFlowConfig", "align", "cfm_losses",
    "cfm_objective", "fit_equivariant_cnf", "load_equivariant_cnf", "orthogonal_cost",
    "procrustes",
]  # fmt: skip
