"""Manifold geometry: Gr(k, D) with orthonormal representatives ``(..., D, k)``."""

from .grassmann import Grassmann, orthonormality_error

__all__ = ["Grassmann", "orthonormality_error"]
