"""Riemannian divergence of a horizontal vector field on Gr(k, D).

For a field given by horizontal lifts X(Y), the divergence on Gr(k, D) is the trace of the
Euclidean Jacobian DX restricted to the horizontal space at Y:
``div X = sum_a <E_a, DX[E_a]>`` over an orthonormal basis E_a of ``{Z : Y^T Z = 0}``
(the lift of the Levi-Civita connection is the horizontal part of the ambient derivative).

The basis is built from a detached orthonormal complement and then projected with the tracked
``I - Y Y^T``. At the current Y the projection changes nothing, but it makes the first derivative
of the trace with respect to Y (needed for training through the ODE) exact: the trace depends on Y
only through the projector.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "divergence_exact", "divergence_hutchinson", "horizontal_basis", "horizontal_frame",
    "horizontal_noise",
]  # fmt: skip

Field = Callable[[Tensor], Tensor]


def horizontal_frame(Y: Tensor) -> Tensor:
    """Orthonormal complement of ``Y: (..., D, k)``, ``(..., D, D - k)``: detached, then
    projected with the tracked ``I - Y Y^T``."""
    k = Y.shape[-1]
    with torch.no_grad():
        Q = torch.linalg.qr(Y.detach(), mode="complete")[0][..., k:]
    return Q - Y @ (Y.mT @ Q)


def horizontal_basis(Y: Tensor, frame: Tensor | None = None) -> Tensor:
    """Orthonormal basis of the horizontal space at ``Y: (..., D, k)``: ``(k(D-k), ..., D, k)``,
    ``E[i k + j] = F[..., :, i] e_j^T`` for the frame F (default `horizontal_frame`)."""
    D, k = Y.shape[-2:]
    F = horizontal_frame(Y) if frame is None else frame
    eye = torch.eye(k, dtype=Y.dtype, device=Y.device)
    batch = (1,) * (Y.dim() - 2)
    E = F.movedim(-1, 0)[:, None, ..., None] * eye.view(1, k, *batch, 1, k)  # (D-k, k, ..., D, k)
    return E.reshape((D - k) * k, *Y.shape)


def horizontal_noise(Y: Tensor, noise: Tensor) -> Tensor:
    """Project Gaussian ``noise: (B, D, k)`` onto the horizontal space at Y (Hutchinson probes)."""
    return noise - Y @ (Y.mT @ noise)


def divergence_exact(field: Field, Y: Tensor) -> tuple[Tensor, Tensor]:
    """Exact divergence with k(D-k) Jacobian-vector products (batched with ``vmap``).

    Args:
        field: ``Y: (B, D, k) -> X: (B, D, k)``, built from ``torch.func``-compatible ops.
        Y: ``(..., D, k)`` points.

    Returns:
        ``X: (..., D, k)`` and ``div: (...)``.
    """
    Y = Y.contiguous()  # forward-mode AD rejects expanded (aliased) primals
    E = horizontal_basis(Y)

    def jvp(e: Tensor) -> tuple[Tensor, Tensor]:
        return torch.func.jvp(field, (Y,), (e,))

    X, JE = torch.func.vmap(jvp)(E)
    return X[0], (E * JE).sum(dim=(0, -2, -1))


def divergence_hutchinson(field: Field, Y: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """Unbiased Hutchinson estimate ``<e, DX[e]>`` with horizontal probe ``e = P_Y(noise)``.

    With ``noise ~ N(0, I)``, ``E[e e^T]`` is the horizontal projector, so the estimate's mean is
    the exact divergence. Returns ``X: (B, D, k)`` and ``div: (B,)``.
    """
    Y = Y.contiguous()
    e = horizontal_noise(Y, noise)
    X, Je = torch.func.jvp(field, (Y,), (e,))
    return X, (e * Je).sum(dim=(-2, -1))
