"""The contract every density model of grassflow keeps (zuko-style): a `typing.Protocol`.

A density model draws samples, scores them exactly, and does both at once (for importance
weights). ``tests/test_density_contract.py`` runs one battery over every model: it
integrates to one, it is invariant to its symmetry group, its sampler draws from the law
its ``log_prob`` scores, dtypes are checked, and bad input is refused with a clear error.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["DensityModel"]


@runtime_checkable
class DensityModel(Protocol):
    """A normalized density with a sampler. ``x: (B, *event)``; ``event`` is the model's
    (``(D, k)`` for a `GrCNF`, ``(n, d)`` for a shape model)."""

    def log_prob(self, x: Tensor) -> Tensor:
        """Exact log-density ``(B,)`` of ``x: (B, *event)`` in the model's dtype and device."""
        ...

    def sample(self, m: int, generator: torch.Generator | None = None) -> Tensor:
        """``m`` draws ``(m, *event)``."""
        ...

    def sample_with_log_prob(
        self, m: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """``m`` draws and their exact log-density ``(m,)``."""
        ...
