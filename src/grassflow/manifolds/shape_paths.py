r"""Paths between shapes: the two geometries of point clouds modulo rotation.

A centred cloud ``x: (n, d)`` of rank d, modulo ``x -> x Q`` (Q in O(d)), is its Gram
matrix ``x x^T``, a rank-d PSD matrix. That space has two standard geometries, and each
gives a path from a prior cloud ``x0`` to a data cloud ``x1``:

* ``"cartesian"``: the quotient R^{n x d}_* / O(d) with the Euclidean metric. Its geodesics
  are straight lines ``(1 - t) x0 + t x1`` once ``x1`` is Kabsch-aligned to ``x0``
  (``x0^T x1`` symmetric): equivariant flow matching's paths (Klein et al. 2023).
* ``"grassmann"``: the bundle Gr(d, n) x SPD(d) (Bonnabel & Sepulchre 2009; Journée et al.
  2010; Massart & Absil 2020). With the polar factors ``x = Y G^{1/2}`` (``G = x^T x``), the
  span moves along the Grassmann geodesic ``Y_t`` from ``[Y0]`` to ``[Y1]`` and the metric
  ``G_t`` (in the frame ``Y_t``, which the geodesic transports horizontally) along the
  affine-invariant SPD geodesic ``G0^{1/2} (G0^{-1/2} G1 G0^{-1/2})^t G0^{1/2}``. Only
  ``[x1]`` matters: rotating x1 leaves the path unchanged.

Both paths are lifted to clouds horizontally: their velocity ``u`` satisfies ``x^T u``
symmetric (no rotation of the cloud as a whole), the lift of least motion. The Grassmann
path is evaluated as ``x_t = Y_t R_t`` with ``R_t R_t^T = G_t`` and its velocity projected
on the horizontal space (`horizontal_part`). For a field equivariant to O(d) (the EGNN),
regressing on ``(x_t, horizontal velocity)`` is regressing on the horizontal lift, which
differs by a rotation ``x_t Omega_t``; it ends at ``x1`` rotated, which has the data's law
when that law is invariant. Clouds in 1-perp stay there: the span path lies in the sum
of the two spans, so Gr(d, n) here acts as Gr(d, n - 1) of the CoM-free coordinates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .grassmann import Grassmann

__all__ = ["GEOMETRIES", "RANK_TOL", "bundle_path", "check_full_rank", "horizontal_part",
           "polar", "shape_path", "straight_path"]  # fmt: skip

GEOMETRIES = ("cartesian", "grassmann")
# Smallest over largest eigenvalue of x^T x below which a cloud counts as rank-deficient for
# the Grassmann path: its span's last direction is then noise and the metric's geodesic to
# a near-zero eigenvalue has a velocity ~ log(ratio). QM9's 19-atom molecules are >= 0.016.
RANK_TOL = 1e-6


def _sym_eig_fn(G: Tensor, fn) -> Tensor:
    lam, W = torch.linalg.eigh(G)
    return (W * fn(lam).unsqueeze(-2)) @ W.mT


def polar(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(Y, G)`` with ``x = Y G^{1/2}``: Y ``(..., n, d)`` orthonormal, ``G = x^T x``
    ``(..., d, d)``, for clouds ``x: (..., n, d)`` of rank d."""
    G = x.mT @ x
    return x @ _sym_eig_fn(G, torch.rsqrt), G


def check_full_rank(x: Tensor, what: str = "clouds", tol: float = RANK_TOL) -> None:
    """Raise a ValueError naming the rank-deficient clouds of ``x: (..., n, d)`` (linear or
    planar in 3-D, e.g. flat molecules): those whose ``x^T x`` (after centring) has an
    eigenvalue ratio below ``tol``. The Grassmann geometry needs every cloud of rank d."""
    x = x.detach().double()
    x = x - x.mean(-2, keepdim=True)
    lam = torch.linalg.eigvalsh(x.mT @ x)
    bad = (lam[..., 0] <= tol * lam[..., -1]).flatten()
    if bad.any():
        idx = bad.nonzero().flatten()
        raise ValueError(
            f"the Grassmann geometry needs {what} of rank {x.shape[-1]}, but {len(idx)} of "
            f"{bad.numel()} are rank-deficient (flat or linear; first at index "
            f"{idx[:5].tolist()}): use geometry='cartesian', which is defined for any cloud"
        )


def horizontal_part(x: Tensor, u: Tensor) -> Tensor:
    """The part of ``u: (..., n, d)`` orthogonal to the rotations of ``x: (..., n, d)``:
    ``u - x A`` with A skew and ``x^T (u - x A)`` symmetric (``G A + A G = x^T u - u^T x``,
    solved in G's eigenbasis)."""
    lam, W = torch.linalg.eigh(x.mT @ x)
    C = x.mT @ u
    C = W.mT @ (C - C.mT) @ W
    A = W @ (C / (lam.unsqueeze(-1) + lam.unsqueeze(-2))) @ W.mT
    return u - x @ A


def straight_path(x0: Tensor, x1: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """``x_t = (1 - t) x0 + t x1`` and ``u = x1 - x0`` for clouds ``(..., n, d)`` and times
    ``t: (...)``: the Cartesian geodesic when ``x1`` is aligned to ``x0``."""
    tt = t[..., None, None]
    return (1 - tt) * x0 + tt * x1, x1 - x0


def bundle_path(x0: Tensor, x1: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """The Grassmann-bundle path from ``x0`` to ``[x1]`` at times ``t: (...)``: ``x_t``
    ``(..., n, d)`` and its horizontal velocity. ``x_0 = x0``; ``x_1 x_1^T = x1 x1^T``.
    Computed in float64 (d x d eigen-decompositions), returned in x0's dtype. Raises a
    ValueError if a data cloud ``x1`` is rank-deficient (`check_full_rank`)."""
    check_full_rank(x1, "data clouds")
    dtype = x0.dtype
    x0, x1, t = x0.double(), x1.double(), t.double()
    Y0, G0 = polar(x0)
    Y1 = polar(x1)[0]
    gr = Grassmann(x0.shape[-1], x0.shape[-2])
    Yt, dY = gr.geodesic(Y0, Y1, t)
    B1 = gr.geodesic(Y0, Y1, torch.ones_like(t))[0].mT @ x1  # x1 in the transported frame
    lam0, W0 = torch.linalg.eigh(G0)
    G0h = (W0 * lam0.sqrt().unsqueeze(-2)) @ W0.mT
    G0ih = (W0 * lam0.rsqrt().unsqueeze(-2)) @ W0.mT
    mu, W = torch.linalg.eigh(G0ih @ (B1 @ B1.mT) @ G0ih)
    mu = mu.clamp_min(torch.finfo(mu.dtype).tiny)
    power = mu.pow(t[..., None] / 2)
    Rt = G0h @ (W * power.unsqueeze(-2)) @ W.mT
    dR = G0h @ (W * (0.5 * mu.log() * power).unsqueeze(-2)) @ W.mT
    xt = Yt @ Rt
    return xt.to(dtype), horizontal_part(xt, dY @ Rt + Yt @ dR).to(dtype)


def shape_path(geometry: str, x0: Tensor, x1: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """The conditional path of ``geometry`` (`GEOMETRIES`): `straight_path` or
    `bundle_path`."""
    if geometry == "cartesian":
        return straight_path(x0, x1, t)
    if geometry == "grassmann":
        return bundle_path(x0, x1, t)
    raise ValueError(f"geometry must be one of {GEOMETRIES}, got {geometry!r}")
