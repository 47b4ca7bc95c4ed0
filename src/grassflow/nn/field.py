"""The O(k)-equivariant potential-gradient vector field on Gr(k, D) (paper §4.4)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..ode.divergence import horizontal_basis, horizontal_noise
from .layers import ConcatSquash, HorP

__all__ = ["PRESETS", "GrassmannField", "Potential"]

# hidden widths of the ConcatSquash stack (the final width-1 layer is implicit), paper Tables 3-4
PRESETS: dict[str, tuple[int, ...]] = {
    "textures": (64, 64),
    "dw4": (64, 64, 64),
    "lj13": (32, 32, 32),
    "qm9": (32, 32, 32),
}


class Potential(nn.Module):
    """O(k)-invariant scalar potential ``v(t, Y)``: HorP -> tanh -> Vec -> [CS -> tanh]* -> CS.

    Args:
        D, k: the manifold Gr(k, D).
        hidden: widths of the hidden ConcatSquash layers, e.g. ``(64, 64)``.
        horp_width: columns of the HorP weight; default k (the paper).
        final_tanh: apply tanh to the scalar output, as the paper's tables do.
    """

    def __init__(
        self,
        D: int,
        k: int,
        hidden: Sequence[int] = (64, 64),
        horp_width: int | None = None,
        final_tanh: bool = True,
    ):
        super().__init__()
        width = k if horp_width is None else horp_width
        self.horp = HorP(D, width)
        sizes = [D * width, *hidden, 1]
        self.layers = nn.ModuleList(ConcatSquash(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.final_tanh = final_tanh

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``Y: (..., D, k)`` -> ``(...)``."""
        x = torch.tanh(self.horp(Y)).flatten(-2)
        for i, layer in enumerate(self.layers):
            x = layer(t, x)
            if i < len(self.layers) - 1 or self.final_tanh:
                x = torch.tanh(x)
        return x.squeeze(-1)


class GrassmannField(nn.Module):
    """Horizontal, O(k)-equivariant vector field ``X(t, Y) = (I - Y Y^T) dv/dY``.

    The Riemannian gradient of an O(k)-invariant potential on Gr(k, D). Because v is invariant,
    ``Y^T dv/dY`` is symmetric and this equals the paper's ``Z - Y sym(Y^T Z)`` (eq. 13), with
    ``Y^T X = 0`` exactly rather than up to round-off. Equivariance ``X(t, Y Q) = X(t, Y) Q``
    holds for every Q in O(k), reflections included.

    The gradient is taken with ``torch.func.grad`` so the field composes with ``jvp``/``vmap``
    (exact divergence) and with ordinary autograd (training).

    Args:
        potential: a module ``v(t, Y: (..., D, k)) -> (...)``, invariant under ``Y -> Y Q``.
    """

    def __init__(self, potential: nn.Module):
        super().__init__()
        self.potential = potential

    @classmethod
    def from_preset(cls, D: int, k: int, preset: str = "textures", **kwargs) -> GrassmannField:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
        return cls(Potential(D, k, PRESETS[preset], **kwargs))

    def forward(self, t: Tensor, Y: Tensor) -> Tensor:
        """``t``: scalar tensor; ``Y: (..., D, k)`` -> ``X: (..., D, k)``."""
        G = torch.func.grad(lambda Z: self.potential(t, Z).sum())(Y)
        return G - Y @ (Y.mT @ G)

    def field_and_divergence(
        self, t: Tensor, Y: Tensor, noise: Tensor | None = None, create_graph: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Field and its divergence via the Laplace-Beltrami operator of the potential.

        For ``X = (I - Y Y^T) G`` with ``G = dv/dY`` and horizontal E,
        ``<E, DX[E]> = <E, H[E]> - tr(E^T E Y^T G)`` (H the Euclidean Hessian), so
        ``div X = tr_h(H) - (D - k) tr(Y^T G)``. Hessian-vector products by double backward
        beat ``jvp`` over the ``torch.func`` field on small manifolds (benchmarks/divergence.py).

        Args:
            t: scalar time.
            Y: ``(B, D, k)`` points.
            noise: ``(B, D, k)`` Gaussian probe for a Hutchinson estimate; None for exact
                (k(D - k) Hessian-vector products).
            create_graph: keep the graph for backpropagation through the result.

        Returns:
            ``X: (B, D, k)`` and ``div: (B,)``.
        """
        with torch.enable_grad():
            if not Y.requires_grad:
                Y = Y.detach().requires_grad_(True)
            G = torch.autograd.grad(self.potential(t, Y).sum(), Y, create_graph=True)[0]
            E = horizontal_basis(Y) if noise is None else horizontal_noise(Y, noise)[None]
            HE = torch.autograd.grad(
                G, Y, E if E.shape[0] > 1 else E[0], create_graph=create_graph,
                is_grads_batched=E.shape[0] > 1,
            )[0]
            YtG = Y.mT @ G
            X = G - Y @ YtG
            div = (E * HE).sum(dim=(0, -2, -1)) if E.shape[0] > 1 else (E[0] * HE).sum((-2, -1))
            div = div - ((E.mT @ E).sum(0) * YtG.mT).sum(dim=(-2, -1))
        if not create_graph:
            X, div = X.detach(), div.detach()
        return X, div
