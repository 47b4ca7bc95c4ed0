"""Flows: `GrCNF` on Gr(k, D); `ShapeFlow`, one flow on the point cloud (its
`ShapeFlowConfig` picks the flow-matching geometry, Cartesian or Grassmann); and
`InternalFlow`, a molecule's shape model in internal coordinates (bonds, angles, torsions)."""

from .grcnf import GrCNF
from .internal_flow import InternalFlow, InternalFlowConfig
from .shape_flow import ShapeFlow, ShapeFlowConfig, pack_labels

__all__ = ["GrCNF", "InternalFlow", "InternalFlowConfig", "ShapeFlow", "ShapeFlowConfig",
           "pack_labels"]  # fmt: skip
