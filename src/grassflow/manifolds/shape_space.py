"""Shape geometry: point clouds as spans (points of a Grassmann manifold) and factors.

The one home of the rank test (`full_rank`), the sign rules that make a span's basis
deterministic (`span_basis`), the Helmert basis that removes the centre of mass, the
protocols of DW4/LJ13, and the paper's QM9 factorization (`shape_factor`).

A configuration of n particles in d dimensions is a matrix ``X: (n, d)`` (one row per
particle). After centring, ``P = X - mean`` is determined up to its column span and a
k x k factor: ``P = Y B`` with ``Y`` orthonormal. The span ``[Y]`` is invariant under
rotations and reflections ``X -> X Q`` and under translations, and permuting the particles
permutes the rows of P. Two protocols (``D x k`` representatives, k = d):

- ``"paper"``: ``Y`` spans the columns of ``P`` in R^n, so DW4 lives on Gr(2, 4) and LJ13 on
  Gr(3, 13) (the GrCNF paper's choice). Centring gives ``1^T Y = 0``, so only the part of
  Gr(d, n) orthogonal to ``1`` is ever visited.
- ``"com-free"``: the centre of mass is removed first with the Helmert basis ``H: (n, n-1)``
  (orthonormal, ``1^T H = 0``): ``P' = H^T P``, so DW4 lives on Gr(2, 3) and LJ13 on
  Gr(3, 12), with no wasted dimensions. Since ``P = H P'``, nothing is lost.

In both protocols ``Y`` comes from sign-fixed Gram-Schmidt of the columns (QR with a positive
diagonal of R), so the map is deterministic and ``B = Y^T P'`` is upper triangular.
Configurations of rank < d (e.g. collinear particles in 3-D) have no d-dimensional span.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.2.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "PROTOCOLS", "from_grassmann", "full_rank", "helmert_basis", "representation_shape",
    "shape_factor", "span_basis", "to_grassmann",
]  # fmt: skip

PROTOCOLS: tuple[str, ...] = ("paper", "com-free")


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choices are {', '.join(PROTOCOLS)}")


def full_rank(sv: Tensor, rtol: float = 1e-6) -> Tensor:
    """The rank test: ``(...)`` True where the singular values ``sv: (..., k)`` (descending)
    have ``sv_k > rtol * sv_1``, i.e. where the configuration has a k-dimensional span."""
    return sv[..., -1] > rtol * sv[..., 0].clamp_min(torch.finfo(sv.dtype).tiny)


def _largest_entry_positive(U: Tensor) -> Tensor:
    """``(..., 1, k)`` signs that make the largest-magnitude entry of each column positive."""
    idx = U.abs().argmax(dim=-2, keepdim=True)
    return torch.sign(torch.gather(U, -2, idx))


def span_basis(P: Tensor, method: str = "qr") -> Tensor:
    """The canonical orthonormal basis ``Y: (..., D, k)`` of the span of ``P: (..., D, k)``
    (full rank; see `full_rank`).

    ``"qr"``: Gram-Schmidt of the columns, R with a positive diagonal (the paper's DW4/LJ13
    protocol). ``"eig"``: eigenvectors of ``P P^T``, eigenvalues descending, each column's
    largest-magnitude entry positive (the paper's QM9 protocol); it depends on P only through
    ``P P^T``, so ``P Q`` has the same basis for orthogonal Q.
    """
    if method == "qr":
        Q, R = torch.linalg.qr(P)
        return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    if method == "eig":
        U = torch.linalg.svd(P, full_matrices=False)[0]
        return U * _largest_entry_positive(U)
    raise ValueError(f"method must be 'qr' or 'eig', got {method!r}")


def helmert_basis(
    n: int, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> Tensor:
    """Orthonormal basis ``H: (n, n-1)`` of the complement of ``1 = (1, ..., 1)`` in R^n.

    Column j (0-based) is ``(1, ..., 1, -(j+1), 0, ..., 0) / sqrt((j+1)(j+2))`` with j+1
    ones: the transposed Helmert sub-matrix. ``H^T H = I`` and ``H H^T = I - 1 1^T / n``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"helmert_basis needs an integer n >= 2, got {n!r}")
    i = torch.arange(n, dtype=torch.float64, device=device).unsqueeze(1)
    m = torch.arange(1, n, dtype=torch.float64, device=device)  # ones in column j: m = j + 1
    H = (i < m).double() - m * (i == m).double()
    return (H / torch.sqrt(m * (m + 1.0))).to(dtype)


def representation_shape(n: int, d: int, protocol: str) -> tuple[int, int]:
    """``(D, k)`` of the representatives for n particles in d dimensions.

    ``"paper"``: ``(n, d)`` (Gr(2, 4) for DW4, Gr(3, 13) for LJ13); ``"com-free"``:
    ``(n - 1, d)`` (Gr(2, 3), Gr(3, 12)). Raises ``ValueError`` unless ``1 <= k < D``.
    """
    _check_protocol(protocol)
    D, k = (n, d) if protocol == "paper" else (n - 1, d)
    if not 1 <= k < D:
        raise ValueError(
            f"{n} particles in {d}-D need d < {'n' if protocol == 'paper' else 'n - 1'} for "
            f"the {protocol!r} protocol (Gr({k}, {D}) is not defined)"
        )
    return D, k


def to_grassmann(
    X: Tensor | np.ndarray,
    protocol: str = "com-free",
    *,
    on_degenerate: str = "raise",
    return_factor: bool = False,
    rtol: float = 1e-6,
) -> Tensor | tuple[Tensor, ...]:
    """Map particle configurations to orthonormal representatives of their spans.

    Args:
        X: ``(B, n, d)`` positions; need not be centred. A tensor keeps its dtype and
            device; an ndarray becomes a float64 CPU tensor.
        protocol: ``"paper"`` (Gr(d, n)) or ``"com-free"`` (Gr(d, n-1)); see module docs.
        on_degenerate: what to do with configurations of rank < d (singular value ratio
            ``sigma_d / sigma_1 <= rtol``): ``"raise"`` a ``ValueError`` naming how many and
            which, or ``"skip"`` them and also return the mask of the rows kept (it still
            raises when every row would be skipped).
        return_factor: also return ``B: (B', d, d)`` with ``P' = Y B`` (upper triangular,
            positive diagonal), the input of `from_grassmann`.
        rtol: rank threshold, as in `Grassmann.from_point_cloud`.

    Returns:
        ``Y: (B', D, d)`` alone, or the tuple ``(Y, B)`` with ``return_factor``, with
        ``kept: (B,)`` bool appended when ``on_degenerate="skip"``: ``Y``, ``(Y, kept)``,
        ``(Y, B)`` or ``(Y, B, kept)``. ``B' = B`` unless rows were skipped.
    """
    if isinstance(X, np.ndarray):
        X = torch.as_tensor(np.asarray(X, dtype=np.float64))
    if not isinstance(X, Tensor) or not X.is_floating_point() or X.dim() != 3:
        raise ValueError(
            f"X must be a floating (B, n, d) tensor or array, got {type(X).__name__} "
            f"{getattr(X, 'dtype', '')} of shape {tuple(getattr(X, 'shape', ()))}"
        )
    if X.dtype not in (torch.float32, torch.float64):  # half precision: no SVD, no accuracy
        raise ValueError(f"X must be float32 or float64, got {X.dtype} (shape {tuple(X.shape)})")
    if X.numel() == 0:
        raise ValueError(f"X is an empty batch (shape {tuple(X.shape)})")
    if on_degenerate not in ("raise", "skip"):
        raise ValueError(f"on_degenerate must be 'raise' or 'skip', got {on_degenerate!r}")
    n, d = X.shape[-2:]
    D, k = representation_shape(n, d, protocol)
    finite = torch.isfinite(X).all(dim=(-2, -1))
    if not finite.all():
        first = int((~finite).nonzero()[0, 0])
        raise ValueError(
            f"{int((~finite).sum())} configuration(s) contain NaN or inf; first at index {first}"
        )

    P = X - X.mean(dim=-2, keepdim=True)
    if protocol == "com-free":
        P = helmert_basis(n, X.dtype, X.device).mT @ P
    kept = full_rank(torch.linalg.svdvals(P), rtol)
    if not kept.all():
        bad = (~kept).nonzero()[:, 0]
        if on_degenerate == "raise" or len(bad) == len(X):
            hint = "nothing is left after skipping them"
            if on_degenerate == "raise":
                hint = "use on_degenerate='skip' to drop them"
            raise ValueError(
                f"{len(bad)} of {len(X)} configuration(s) have rank < {k} (e.g. collinear "
                f"particles) and no {k}-dimensional span; indices {bad[:10].tolist()}"
                f"{' ...' if len(bad) > 10 else ''}; {hint}"
            )
        P = P[kept]
    Y = span_basis(P, "qr")
    out = (Y, Y.mT @ P) if return_factor else (Y,)
    if on_degenerate == "skip":
        out = out + (kept,)
    return out[0] if len(out) == 1 else out


def from_grassmann(Y: Tensor, B: Tensor, protocol: str = "com-free") -> Tensor:
    """Inverse of `to_grassmann`: centred positions from a representative and factor.

    Args:
        Y: ``(..., D, k)`` orthonormal representatives.
        B: ``(..., k, k)`` factors from ``to_grassmann(..., return_factor=True)``.
        protocol: the protocol ``Y`` was made with.

    Returns:
        ``X: (..., n, k)`` centred positions, ``n = D`` (paper) or ``D + 1`` (com-free).
    """
    _check_protocol(protocol)
    P = Y @ B
    if protocol == "com-free":
        P = helmert_basis(Y.shape[-2] + 1, Y.dtype, Y.device) @ P
    return P


def shape_factor(P: Tensor, rtol: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """Factor ``P = Y diag(sqrt(lam)) R^T`` (the paper's QM9 representation).

    Args:
        P: ``(..., n, k)`` configurations, ``n > k``.
        rtol: a P whose k-th singular value is ``<= rtol`` times its first is rank deficient.

    Returns:
        Y ``(..., n, k)``: ``span_basis(P, "eig")``; it depends on P only through P P^T, so
        ``shape_factor(P Q)`` has the same Y.
        lam ``(..., k)``: eigenvalues of P^T P, descending.
        R ``(..., k, k)``: orthogonal.

    Raises:
        ValueError: on bad shape/dtype, NaN or inf, or rank-deficient P (with their count).
    """
    if not isinstance(P, Tensor):
        raise ValueError(f"P must be a torch.Tensor, got {type(P).__name__}")
    if not P.is_floating_point() or P.dim() < 2 or P.numel() == 0:
        raise ValueError(f"P must be a non-empty floating-point (..., n, k) tensor, got "
                         f"{P.dtype} of shape {tuple(P.shape)}")  # fmt: skip
    if not torch.isfinite(P).all():
        raise ValueError("P contains NaN or inf")
    n, k = P.shape[-2:]
    if not 1 <= k < n:
        raise ValueError(f"P must have shape (..., n, k) with 1 <= k < n, got {tuple(P.shape)}")
    U, s, Vh = torch.linalg.svd(P, full_matrices=False)
    bad = ~full_rank(s, rtol)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} configuration(s) have rank < {k} (all points on a "
            f"{k - 1}-dimensional subspace); first at batch index "
            f"{tuple(bad.nonzero()[0].tolist())}"
        )
    # flipping a column of U and of V together keeps P, so R takes the same signs
    sign = _largest_entry_positive(U)
    return U * sign, s.square(), Vh.mT * sign
