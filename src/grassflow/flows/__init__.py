"""Flows on Gr(k, D), and the shape flow on point clouds built from one."""

from .grcnf import GrCNF
from .shape_flow import DEFAULT_LAYERS, GRAMS, POTENTIALS, ShapeFlow, build_field, build_gram

__all__ = [
    "DEFAULT_LAYERS", "GRAMS", "POTENTIALS", "GrCNF", "ShapeFlow", "build_field", "build_gram",
]  # fmt: skip
