"""Manifold geometry: Gr(k, D) with orthonormal representatives ``(..., D, k)``, point
clouds as spans (`shape_space`), the flow-matching paths between clouds (`shape_paths`) and
clouds aligned without atom correspondence (`alignment`)."""

from .grassmann import Grassmann, orthonormality_error
from .shape_space import (
    PROTOCOLS,
    from_grassmann,
    helmert_basis,
    representation_shape,
    shape_factor,
    to_grassmann,
)

__all__ = [
    "PROTOCOLS",
    "Grassmann",
    "from_grassmann",
    "helmert_basis",
    "orthonormality_error",
    "representation_shape",
    "shape_factor",
    "to_grassmann",
]
