"""Flows on Gr(k, D), and the shape flow on point clouds built from one."""

from .grcnf import GrCNF
from .shape import DEFAULT_LAYERS, POTENTIALS, ShapeFlow

__all__ = ["DEFAULT_LAYERS", "POTENTIALS", "GrCNF", "ShapeFlow"]
