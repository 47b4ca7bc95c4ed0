"""Simulation-free training: Riemannian flow matching on Gr(k, D).

A prior sample Y0 and a data point Y1 are joined by the geodesic ``Y_s`` (s in [0, 1]); the
field is regressed onto its velocity ``u_s`` in the quotient metric. No ODE is solved during
training; likelihoods are evaluated afterwards with the exact-divergence ODE.

References:
    Chen, Lipman. Flow Matching on General Geometries. ICLR 2024, arXiv:2302.03660.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["flow_matching_objective"]


def flow_matching_objective(model: nn.Module, batch: Tensor) -> tuple[Tensor, dict[str, Any]]:
    """Flow-matching loss ``E ||T X(sT, Y_s) - u_s||^2`` for a :class:`GrCNF`.

    Uses GrCNF's time convention (prior at s = 0, data at s = 1, ``dY/ds = T X(sT, Y)``), so a
    model trained this way is an ordinary GrCNF: same checkpoint, ``log_prob`` and ``sample``.
    Prior samples and times come from the global RNG, which the training loop seeds and
    checkpoints.

    Args:
        model: a GrCNF (needs ``prior()``, ``manifold``, ``field`` and ``T``).
        batch: ``(B, D, k)`` data points.

    Returns:
        The scalar loss (mean over the batch) and stats ``{"nfe": 0}``.
    """
    n = batch.shape[0]
    Y0 = model.prior().sample((n,))
    s = torch.rand(n, dtype=batch.dtype, device=batch.device)
    Ys, us = model.manifold.geodesic(Y0, batch, s)
    T = model.T.to(batch)
    v = T * model.field(s * T, Ys)
    loss = (v - us).square().sum(dim=(-2, -1)).mean()
    return loss, {"nfe": 0}
