"""Flows on Gr(k, D)."""

from .grcnf import GrCNF

__all__ = ["GrCNF"]
