"""Neural networks for GrCNF: HorP, ConcatSquash, potential, equivariant gradient field."""

from .field import PRESETS, GrassmannField, Potential
from .layers import ConcatSquash, HorP, scale_init_

__all__ = ["PRESETS", "ConcatSquash", "GrassmannField", "HorP", "Potential", "scale_init_"]
