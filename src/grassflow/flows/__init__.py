"""Flows: `GrCNF` on Gr(k, D), and `ShapeFlow`, the library's shape model (one flow on the
point cloud; its `ShapeFlowConfig` picks the flow-matching geometry)."""

from .grcnf import GrCNF
from .shape_flow import ShapeFlow, ShapeFlowConfig, pack_labels

__all__ = ["GrCNF", "ShapeFlow", "ShapeFlowConfig", "pack_labels"]
