"""Manifold geometry: Gr(k, D) with orthonormal representatives ``(..., D, k)``, point
clouds as spans (`shape_space`), the flow-matching paths between clouds (`shape_paths`) and
clouds aligned without atom correspondence (`alignment`), and a molecule's internal
coordinates (`zmatrix`: the Z-matrix of its bond graph; `internal`: the bijection to
orientation, bonds, angles and torsions)."""

from .grassmann import Grassmann, orthonormality_error
from .internal import InternalCoordinates
from .shape_space import (
    PROTOCOLS,
    from_grassmann,
    helmert_basis,
    representation_shape,
    shape_factor,
    to_grassmann,
)
from .zmatrix import ZMatrix, build_zmatrix

__all__ = [
    "PROTOCOLS",
    "Grassmann",
    "from_grassmann",
    "helmert_basis",
    "InternalCoordinates",
    "ZMatrix",
    "build_zmatrix",
    "orthonormality_error",
    "representation_shape",
    "shape_factor",
    "to_grassmann",
]
