"""Flows on Gr(k, D): `GrCNF`. (The library's shape model on point clouds is
`grassflow.baselines.EquivariantCNF`, one flow on the cloud.)"""

from .grcnf import GrCNF

__all__ = ["GrCNF"]
