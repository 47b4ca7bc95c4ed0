"""Conditional flow matching for `ShapeFlow`, with equivariant minibatch OT.

A prior cloud ``x0`` and a data cloud ``x1`` (both centred) are joined by the conditional
path of the model's ``geometry`` (`grassflow.manifolds.shape_paths`): the straight line
``x_t = (1 - t) x0 + t x1`` with target ``x1 - x0`` (``"cartesian"``, EFM's), or the
Grassmann-bundle path (``"grassmann"``). The pairs of a minibatch are chosen by a coupling:

* ``"independent"``: as drawn;
* ``"ot"``: an exact assignment minimizing the summed squared distance (Tong et al. 2023);
* ``"equivariant-ot"`` (EFM's "equivariant OT", as far as affordable on a CPU): the cost of
  a pair is its squared distance after the best orthogonal transformation of ``x1``
  (Procrustes, reflections allowed, for all B^2 pairs in one batched SVD); after the
  assignment, each chosen ``x1`` is relabelled and rotated towards its ``x0`` (`align`:
  alternating Hungarian relabelling and Procrustes rotation from several starts). EFM
  searches the relabelling for all B^2 pairs; here it is done for the B chosen pairs only,
  because B^2 Hungarian solves per step would cost more than the step itself. The data law
  is invariant under both groups, so aligning ``x1`` changes the coupling, not the target.
  A model with point labels (atom types) is invariant only to relabellings that keep them,
  so its ``x1`` is relabelled within each label only.

References:
    Lipman et al. Flow Matching for Generative Modeling. ICLR 2023.
    Tong et al. Improving and generalizing flow-based generative models with minibatch optimal
    transport. TMLR 2024.
    Klein, Krämer, Noé. Equivariant Flow Matching. NeurIPS 2023.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from ..flows.shape_flow import COUPLINGS
from ..manifolds.shape_paths import GEOMETRIES, shape_path
from ..metrics.alignment import assign_within_labels, label_groups

__all__ = [
    "CFM_COUPLINGS", "align", "cfm_losses", "cfm_objective", "orthogonal_cost", "procrustes",
]  # fmt: skip

CFM_COUPLINGS = COUPLINGS


def procrustes(A: Tensor, B: Tensor) -> Tensor:
    """The orthogonal ``R: (..., d, d)`` minimizing ``|A - B R|`` for clouds ``(..., n, d)``
    (reflections allowed: the flow is equivariant to them too)."""
    U, _, Vh = torch.linalg.svd(B.mT @ A)
    return U @ Vh


def orthogonal_cost(X0: Tensor, X1: Tensor) -> Tensor:
    """``C[a, b] = min_R |X0[a] - X1[b] R|^2`` over orthogonal R, for centred clouds
    ``X0: (B0, n, d)``, ``X1: (B1, n, d)`` -> ``(B0, B1)``."""
    M = X1.unsqueeze(0).mT @ X0.unsqueeze(1)  # (B0, B1, d, d)
    nuclear = torch.linalg.svdvals(M).sum(-1)
    sq = lambda X: X.square().sum((-2, -1))
    return sq(X0)[:, None] + sq(X1)[None, :] - 2 * nuclear


def _assignment(cost: Tensor) -> Tensor:
    """``p`` with ``sum_i cost[p[i], i]`` minimal: row indices for each column."""
    rows, cols = linear_sum_assignment(cost.detach().cpu().numpy())
    p = np.empty(len(cols), dtype=np.int64)
    p[cols] = rows
    return torch.as_tensor(p, device=cost.device)


def _axis_starts(x0: Tensor, x1: Tensor) -> Tensor:
    """``(2^d, B, d, d)`` orthogonal maps taking x1's principal axes onto x0's, one per choice
    of the axes' signs: starts that a local alignment search cannot reach from each other."""
    d = x0.shape[-1]
    V0 = torch.linalg.svd(x0, full_matrices=False)[2].mT  # (B, d, d): columns = axes
    V1 = torch.linalg.svd(x1, full_matrices=False)[2].mT
    signs = torch.cartesian_prod(*[torch.tensor([1.0, -1.0])] * d).reshape(-1, d).to(x0)
    return V1 @ torch.diag_embed(signs)[:, None] @ V0.mT


def align(x0: Tensor, x1: Tensor, rounds: int = 1, labels: Tensor | None = None) -> Tensor:
    """``x1`` relabelled and rotated towards ``x0`` (both ``(B, n, d)``, centred).

    From each of the 2^d principal-axis starts (`_axis_starts`) and from the
    Procrustes rotation, ``rounds`` of (Hungarian relabelling of x1's points to x0's, then
    Procrustes rotation); the closest result per pair is kept. A local search: it can miss
    the global optimum, but it never returns x1 farther from x0 than the rotation alone.
    With ``labels: (n,)`` (of both clouds' points) only points of equal labels swap."""
    B, n, d = x1.shape
    groups = None if labels is None else label_groups(labels.cpu().numpy(), n)
    starts = torch.cat([_axis_starts(x0, x1), procrustes(x0, x1)[None]])  # (S, B, d, d)
    X0 = x0.expand(len(starts), B, n, d).reshape(-1, n, d)
    y = (x1 @ starts).reshape(-1, n, d)
    for _ in range(rounds):
        cost = torch.cdist(X0, y).square()  # (S B, n, n): x0's point i vs y's point j
        if groups is None:
            perm = torch.stack([_assignment(c.T) for c in cost])  # y's point for each of x0's
        else:
            perms = [assign_within_labels(c.cpu().numpy(), groups) for c in cost]
            perm = torch.as_tensor(np.stack(perms), device=y.device)
        y = torch.gather(y, 1, perm.unsqueeze(-1).expand_as(y))
        y = y @ procrustes(X0, y)
    y = y.reshape(len(starts), B, n, d)
    best = (y - x0).square().sum((-2, -1)).argmin(0)  # (B,)
    return y[best, torch.arange(B)]


def cfm_losses(
    model: nn.Module, x0: Tensor, x1: Tensor, t: Tensor, geometry: str = "cartesian"
) -> Tensor:
    """``|v(t, x_t) - u_t|^2`` per pair ``(B,)`` on the path of ``geometry`` between centred
    clouds ``x0, x1: (B, n, d)`` at times ``t: (B,)`` (`shape_path`: the straight line, or
    the Grassmann-bundle path). Both sides are centred, so the norm is that of the CoM-free
    coordinates."""
    xt, ut = shape_path(geometry, x0, x1, t)
    return (model.field(t, xt) - ut).square().sum((-2, -1))


def cfm_objective(
    model: nn.Module, batch: Tensor, coupling: str = "equivariant-ot", geometry: str = "cartesian"
) -> tuple[Tensor, dict[str, Any]]:
    """Flow-matching loss of a `ShapeFlow` on a batch of clouds ``(B, n, d)``
    (any translation), on the conditional paths of ``geometry`` (`GEOMETRIES`). Prior
    clouds and times come from the global RNG, which the training loop seeds and
    checkpoints. The Grassmann path depends on ``x1`` only up to rotation, so of the
    equivariant-OT alignment only the relabelling matters to it.

    Returns:
        The mean of `cfm_losses` and stats ``{"nfe": 0}``.
    """
    if coupling not in CFM_COUPLINGS:
        raise ValueError(f"coupling must be one of {CFM_COUPLINGS}, got {coupling!r}")
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")
    x1 = batch - batch.mean(dim=-2, keepdim=True)
    B = x1.shape[0]
    z = torch.randn(B, model.n_points - 1, model.dim, dtype=x1.dtype, device=x1.device)
    x0 = model.clouds(z * model.prior_std.to(x1))
    with torch.no_grad():
        if coupling == "ot":
            x0 = x0[_assignment(torch.cdist(x0.flatten(1), x1.flatten(1)).square())]
        elif coupling == "equivariant-ot":
            x0 = x0[_assignment(orthogonal_cost(x0, x1))]
            x1 = align(x0, x1, labels=getattr(model, "labels", None))
    t = torch.rand(B, dtype=x1.dtype, device=x1.device)
    return cfm_losses(model, x0, x1, t, geometry).mean(), {"nfe": 0}
