"""Flows on Gr(k, D), and the shape flow on point clouds built from one."""

from .grcnf import GrCNF
from .shape import POTENTIALS, ShapeFlow

__all__ = ["POTENTIALS", "GrCNF", "ShapeFlow"]
