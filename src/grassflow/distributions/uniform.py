"""The uniform (Haar) distribution on Gr(k, D)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints

from ..manifolds import Grassmann

__all__ = ["UniformGrassmann"]


class UniformGrassmann(Distribution):
    """Uniform distribution on Gr(k, D), ``log_prob = -log V_Gr(k, D)``.

    Densities in grassflow are with respect to the Riemannian volume of Gr(k, D) under the
    quotient metric ``tr(xi^T eta)``, so this one is the constant ``1 / V_Gr``.

    Args:
        manifold: the Grassmann manifold.
        dtype: of the samples (default: torch's default dtype).
        device: of the samples (default: CPU).
    """

    arg_constraints: dict = {}
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        manifold: Grassmann,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        self.manifold = manifold
        self.dtype = dtype or torch.get_default_dtype()
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        super().__init__(torch.Size(), torch.Size((manifold.D, manifold.k)), validate_args=False)

    def sample(self, sample_shape=torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        return self.manifold.random(
            *sample_shape, generator=generator, dtype=self.dtype, device=self.device
        )

    def log_prob(self, value: Tensor) -> Tensor:
        self.manifold.check_point(value, name="value")
        return self.log_prob_unchecked(value)

    def log_prob_unchecked(self, value: Tensor) -> Tensor:
        """``log_prob`` without input checks (for use inside solvers and training loops)."""
        return value.new_full(value.shape[:-2], -self.manifold.log_volume())

    def entropy(self) -> Tensor:
        return torch.tensor(self.manifold.log_volume(), dtype=self.dtype, device=self.device)
