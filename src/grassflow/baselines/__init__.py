"""The old names of the shape model, kept so that users' code keeps working.

The E(n)-equivariant flow-matching CNF (EFM; Klein, Krämer & Noé 2023) is the library's
shape model, `grassflow.flows.ShapeFlow`, with ``geometry="cartesian"`` (the default): the
EFM baseline. ``EquivariantCNF`` is ``ShapeFlow``; ``fit_equivariant_cnf`` and
``load_equivariant_cnf`` are `grassflow.training.fit_shape_flow` and
`grassflow.training.load_shape_flow`; the flow-matching names come from
`grassflow.training.shape_matching`, and ``align``, ``orthogonal_cost`` and ``procrustes``
from `grassflow.manifolds.alignment` (``align`` is `align_pairs`). New code should import
them from there.
"""

from ..flows.shape_flow import ShapeFlow, ShapeFlowConfig
from ..manifolds.alignment import align_pairs, orthogonal_cost, procrustes
from ..nn.egnn import EGNNField
from ..training.shape_fit import fit_shape_flow, load_shape_flow
from ..training.shape_matching import CFM_COUPLINGS, cfm_losses, cfm_objective

EquivariantCNF = ShapeFlow
align = align_pairs
fit_equivariant_cnf = fit_shape_flow
load_equivariant_cnf = load_shape_flow

__all__ = [
    "CFM_COUPLINGS", "EGNNField", "EquivariantCNF", "ShapeFlowConfig", "align", "cfm_losses",
    "cfm_objective", "fit_equivariant_cnf", "load_equivariant_cnf", "orthogonal_cost",
    "procrustes",
]  # fmt: skip
