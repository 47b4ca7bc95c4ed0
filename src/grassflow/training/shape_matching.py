"""Conditional flow matching for `ShapeFlow`, with equivariant minibatch OT.

A prior cloud ``x0`` and a data cloud ``x1`` (both centred) are joined by the conditional
path of the model's ``geometry`` (`grassflow.manifolds.shape_paths`): the straight line
``x_t = (1 - t) x0 + t x1`` with target ``x1 - x0`` (``"cartesian"``, EFM's), or the
Grassmann-bundle path (``"grassmann"``). The pairs of a minibatch are chosen by a coupling:

* ``"independent"``: as drawn;
* ``"ot"``: an exact assignment minimizing the summed squared distance (Tong et al. 2023);
* ``"equivariant-ot"`` (EFM's "equivariant OT", as far as affordable on a CPU): the cost of
  a pair is its squared distance after the best orthogonal transformation of ``x1``
  (`orthogonal_cost`, reflections allowed, for all B^2 pairs in one batched SVD); after the
  assignment, each chosen ``x1`` is relabelled and rotated towards its ``x0`` (`align_pairs`:
  alternating Hungarian relabelling and Procrustes rotation from several starts). EFM
  searches the relabelling for all B^2 pairs; here it is done for the B chosen pairs only,
  because B^2 Hungarian solves per step would cost more than the step itself. The data law
  is invariant under both groups, so aligning ``x1`` changes the coupling, not the target.
  A model with point labels (atom types) is invariant only to relabellings that keep them,
  so its ``x1`` is relabelled within each label only (a model with labels per cloud: within
  each of that cloud's labels, which then travel with it); a model with a bond graph is not
  relabelled at all (a relabelling within an element would break bonds), only rotated.

The assignments, Procrustes maps and the alignment are `grassflow.manifolds.alignment`'s.

References:
    Lipman et al. Flow Matching for Generative Modeling. ICLR 2023.
    Tong et al. Improving and generalizing flow-based generative models with minibatch optimal
    transport. TMLR 2024.
    Klein, Krämer, Noé. Equivariant Flow Matching. NeurIPS 2023.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..flows.shape_flow import COUPLINGS
from ..manifolds.alignment import align_pairs, assignment, orthogonal_cost, procrustes
from ..manifolds.shape_paths import GEOMETRIES, shape_path

__all__ = ["CFM_COUPLINGS", "cfm_losses", "cfm_objective"]

CFM_COUPLINGS = COUPLINGS


def cfm_losses(
    model: nn.Module,
    x0: Tensor,
    x1: Tensor,
    t: Tensor,
    geometry: str = "cartesian",
    labels: Tensor | None = None,
) -> Tensor:
    """``|v(t, x_t) - u_t|^2`` per pair ``(B,)`` on the path of ``geometry`` between centred
    clouds ``x0, x1: (B, n, d)`` at times ``t: (B,)`` (`shape_path`: the straight line, or
    the Grassmann-bundle path); ``labels: (B, n)`` of the pairs for a model with labels per
    cloud. Both sides are centred, so the norm is that of the CoM-free coordinates."""
    xt, ut = shape_path(geometry, x0, x1, t)
    v = model.field(t, xt) if labels is None else model.field(t, xt, labels)
    return (v - ut).square().sum((-2, -1))


def cfm_objective(
    model: nn.Module, batch: Tensor, coupling: str = "equivariant-ot", geometry: str = "cartesian"
) -> tuple[Tensor, dict[str, Any]]:
    """Flow-matching loss of a `ShapeFlow` on a batch of clouds ``(B, n, d)`` (any
    translation; packed ``(B, n, d + 1)`` with their labels for a model with labels per
    cloud, `grassflow.flows.shape_flow.pack_labels`), on the conditional paths of
    ``geometry`` (`GEOMETRIES`). Prior clouds and times come from the global RNG, which the
    training loop seeds and checkpoints. The Grassmann path depends on ``x1`` only up to
    rotation, so of the equivariant-OT alignment only the relabelling matters to it.

    Returns:
        The mean of `cfm_losses` and stats ``{"nfe": 0}``.
    """
    if coupling not in CFM_COUPLINGS:
        raise ValueError(f"coupling must be one of {CFM_COUPLINGS}, got {coupling!r}")
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")
    labels = None
    if getattr(model, "labels_per_cloud", False):
        batch, labels = model.split_labels(batch)
    x1 = batch - batch.mean(dim=-2, keepdim=True)
    B = x1.shape[0]
    z = torch.randn(B, model.n_points - 1, model.dim, dtype=x1.dtype, device=x1.device)
    x0 = model.clouds(model.scale_prior(z))
    with torch.no_grad():  # assignment(C).argsort(): the x0 of each x1
        if coupling == "ot":
            x0 = x0[assignment(torch.cdist(x0.flatten(1), x1.flatten(1)).square()).argsort()]
        elif coupling == "equivariant-ot":
            x0 = x0[assignment(orthogonal_cost(x0, x1)).argsort()]
            if getattr(model, "bonds", None) is None:
                fixed = getattr(model, "labels", None)
                x1 = align_pairs(x0, x1, labels=fixed if labels is None else labels)
            else:  # relabelling would break bonds: only the rotation
                x1 = x1 @ procrustes(x0, x1)
    t = torch.rand(B, dtype=x1.dtype, device=x1.device)
    return cfm_losses(model, x0, x1, t, geometry, labels).mean(), {"nfe": 0}
