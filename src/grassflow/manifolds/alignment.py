r"""Aligning point clouds: the atom correspondence and the orthogonal map together.

Two clouds ``A, B: (n, d)`` describe the same shape when ``A = B[perm] R`` for a relabelling
``perm`` and an orthogonal ``R``. Finding both is the alignment; its two steps have one home:

* `assignment`: the relabelling for a fixed frame (Hungarian, exact; within each label group
  when points carry labels, e.g. atom types);
* `procrustes`: the orthogonal map for a fixed relabelling (Kabsch; reflections optional);
  `orthogonal_cost`: its squared residuals for all pairs of two batches at once.

Alternating them from several starting frames gives two procedures, each for one job:

* `align_pairs` (torch, batched): each cloud of ``x1`` relabelled and rotated towards its
  partner in ``x0``, cheaply, for the pairs of flow-matching training
  (`grassflow.training.shape_matching`);
* `superpose` (numpy, one pair; `superpose_batch`: many clouds onto one): the best-RMSD
  superposition with unknown correspondence, from many starts, for evaluation (nearest
  training molecules, `grassflow.metrics.nearest`; bonds kept, `grassflow.metrics.bonds`).

`procrustes` and `assignment` take tensors or ndarrays and return their kind.

References:
    Kabsch. A solution for the best rotation to relate two sets of vectors. Acta Cryst. 1976.
    Kuhn. The Hungarian method for the assignment problem. Naval Res. Logist. 1955.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

__all__ = [
    "align_pairs", "assignment", "label_groups", "orthogonal_cost", "procrustes", "superpose",
    "superpose_batch",
]  # fmt: skip


# ------------------------------------------------------------------ the two steps


def label_groups(labels, n: int) -> list[np.ndarray] | None:
    """The point indices of each label value (for `assignment`), or None for no labels.

    Args:
        labels (ArrayLike | None): integer labels, shape=[n].
        n: the number of points.
    """
    if labels is None:
        return None
    L = np.asarray(labels)
    if L.shape != (n,) or not np.issubdtype(L.dtype, np.integer):
        raise ValueError(f"labels must be {n} integers, got {L.dtype} of shape {L.shape}")
    return [np.flatnonzero(L == v) for v in np.unique(L)]


def assignment(cost, groups: list[np.ndarray] | None = None) -> Tensor | np.ndarray:
    """The permutation ``perm`` minimizing ``sum_i cost[i, perm[i]]`` (Hungarian, exact).

    With ``groups`` (`label_groups`), ``perm`` maps every group onto itself: one solve per
    group. ``perm.argsort()`` is the inverse: the row matched with each column.

    Args:
        cost (Tensor | ndarray): shape=[n, n].
        groups: index arrays partitioning range(n), or None.

    Returns:
        The int64 permutation, shape [n]; a tensor on ``cost``'s device if ``cost`` is one.
    """
    if isinstance(cost, Tensor):
        return torch.as_tensor(assignment(cost.detach().cpu().numpy(), groups),
                               device=cost.device)  # fmt: skip
    if groups is None:
        return linear_sum_assignment(cost)[1]
    perm = np.empty(len(cost), np.int64)
    for g in groups:
        perm[g] = g[linear_sum_assignment(cost[np.ix_(g, g)])[1]]
    return perm


def procrustes(A, B, reflections: bool = True) -> Tensor | np.ndarray:
    """The orthogonal ``R`` minimizing ``|A - B R|`` (Kabsch): ``R = U V^T`` for the SVD
    ``B^T A = U S V^T``; with ``reflections=False`` the best rotation (``det R = +1``).

    Args:
        A (Tensor | ndarray): target clouds, shape=[..., n, d], centred.
        B (Tensor | ndarray): clouds to move, shape=[..., n, d], centred, of A's kind.
        reflections: allow ``det R = -1``.

    Returns:
        The orthogonal R, shape [..., d, d], of A's kind.
    """
    linalg = torch.linalg if isinstance(A, Tensor) else np.linalg
    U, _, Vh = linalg.svd(B.mT @ A)
    if not reflections:
        sign = torch.sign if isinstance(A, Tensor) else np.sign
        U[..., -1] *= sign(linalg.det(U @ Vh))[..., None]
    return U @ Vh


def orthogonal_cost(X0: Tensor, X1: Tensor) -> Tensor:
    """``C[a, b] = min_R |X0[a] - X1[b] R|^2`` over orthogonal R, for centred clouds
    ``X0: (B0, n, d)``, ``X1: (B1, n, d)`` -> ``(B0, B1)`` (the nuclear norm of
    ``X1[b]^T X0[a]``: no SVD vectors)."""
    M = X1.unsqueeze(0).mT @ X0.unsqueeze(1)  # (B0, B1, d, d)
    nuclear = torch.linalg.svdvals(M).sum(-1)
    sq = lambda X: X.square().sum((-2, -1))
    return sq(X0)[:, None] + sq(X1)[None, :] - 2 * nuclear


# ------------------------------------------------------------------ training pairs


def _axis_starts(x0: Tensor, x1: Tensor) -> Tensor:
    """``(2^d, B, d, d)`` orthogonal maps taking x1's principal axes onto x0's, one per choice
    of the axes' signs: starts that a local alignment search cannot reach from each other."""
    d = x0.shape[-1]
    V0 = torch.linalg.svd(x0, full_matrices=False)[2].mT  # (B, d, d): columns = axes
    V1 = torch.linalg.svd(x1, full_matrices=False)[2].mT
    signs = torch.cartesian_prod(*[torch.tensor([1.0, -1.0])] * d).reshape(-1, d).to(x0)
    return V1 @ torch.diag_embed(signs)[:, None] @ V0.mT


def align_pairs(x0: Tensor, x1: Tensor, rounds: int = 1, labels: Tensor | None = None) -> Tensor:
    """Each ``x1[b]`` relabelled and rotated towards ``x0[b]`` (both ``(B, n, d)``, centred):
    the pairs of equivariant flow matching.

    From each of the 2^d principal-axis starts and from the `procrustes` map, ``rounds`` of
    (`assignment` of x1's points to x0's, then `procrustes`); the closest result per pair is
    kept. A local search: it can miss the global optimum, but it never returns x1 farther
    from x0 than the orthogonal map alone. With ``labels: (n,)`` (of both clouds' points),
    or ``(B, n)`` (of each pair's), only points of equal labels swap. Reflections are allowed.

    Returns:
        ``(B, n, d)``: ``x1[b][perm_b] R_b``, row i matched with ``x0[b, i]``.
    """
    B, n, d = x1.shape
    if labels is None:
        groups = None
    elif labels.dim() == 1:
        groups = [label_groups(labels.cpu().numpy(), n)] * B
    else:  # per pair: pair b of every start
        groups = [label_groups(a, n) for a in labels.cpu().numpy()]
    starts = torch.cat([_axis_starts(x0, x1), procrustes(x0, x1)[None]])  # (S, B, d, d)
    X0 = x0.expand(len(starts), B, n, d).reshape(-1, n, d)
    y = (x1 @ starts).reshape(-1, n, d)
    for _ in range(rounds):
        cost = torch.cdist(X0, y).square()  # (S B, n, n): x0's point i vs y's point j
        if groups is None:  # the transposed problem, inverted (as solved since issue 21)
            perm = torch.stack([assignment(c.T).argsort() for c in cost])
        else:
            perm = torch.stack([assignment(c, groups[k % B])  # y's point for x0's
                                for k, c in enumerate(cost)])  # fmt: skip
        y = torch.gather(y, 1, perm.unsqueeze(-1).expand_as(y))
        y = y @ procrustes(X0, y)
    y = y.reshape(len(starts), B, n, d)
    best = (y - x0).square().sum((-2, -1)).argmin(0)  # (B,)
    return y[best, torch.arange(B)]


# ------------------------------------------------------------------ evaluation

_SIGNED_PERMS = np.array(
    [
        np.eye(3)[list(p)] * np.array(s)[:, None]
        for p in itertools.permutations(range(3))
        for s in itertools.product((1.0, -1.0), repeat=3)
    ]
)  # (48, 3, 3): the signed permutation matrices


def _starts(A, B, reflections: bool, restarts: int, seed: int, axis_perms: bool = True):
    """Starting transforms ``(C, S, 3, 3)`` for each ``B: (C, n, 3)`` onto ``A: (n, 3)``.

    B's principal frame mapped onto A's under every signed axis permutation (48; only
    the 8 sign flips if not ``axis_perms``; half of either if not ``reflections``), then
    ``restarts`` Haar-random orthogonal matrices (the same for every ``C``).
    """
    Va = np.linalg.eigh(A.T @ A)[1]
    Vb = np.linalg.eigh(B.mT @ B)[1]
    S = _SIGNED_PERMS if axis_perms else _SIGNED_PERMS[:8]  # [:8]: signs only
    R = Va @ S[None] @ Vb[:, None].mT
    if not reflections:  # det R = det(Va) det(S) det(Vb): half of them are proper
        R = R[np.linalg.det(R) > 0].reshape(len(B), len(S) // 2, 3, 3)
    if restarts > 0:
        Q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((restarts, 3, 3)))
        Q = Q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]  # Haar on O(3)
        if not reflections:
            Q = Q * np.sign(np.linalg.det(Q))[:, None, None]  # -Q flips det in 3-D
        R = np.concatenate([R, np.broadcast_to(Q, (len(B), *Q.shape))], 1)
    return R


def superpose_batch(A, B, reflections, restarts, seed, max_iter, axis_perms=True, labels=None):
    """Superpose each centred ``B: (C, n, 3)`` onto centred ``A: (n, 3)`` (`superpose`'s
    search for many clouds at once).

    All starts of all ``C`` problems advance together (batched numpy); only the Hungarian
    step loops in Python. A start stops once it reaches an assignment already seen for
    its problem, since the alternation from a given assignment on is deterministic.
    ``labels: (n,)`` (shared by A and B) restricts the assignment to equal labels.

    Returns ``perm: (C, n)``, ``R: (C, 3, 3)``, ``err: (C,)`` (sum of squared residuals
    ``|A - B[perm] R^T|^2``).
    """
    C, n = B.shape[:2]
    groups = label_groups(labels, n)
    R = _starts(A, B, reflections, restarts, seed, axis_perms)
    owner = np.repeat(np.arange(C), R.shape[1])
    R = R.reshape(-1, 3, 3).copy()
    best_err, best_perm, best_R = np.full(C, np.inf), np.zeros((C, n), np.int64), R[:C].copy()
    seen: list[set[bytes]] = [set() for _ in range(C)]
    active = np.arange(len(R))
    for _ in range(max_iter):
        # assignment cost |a_i - R b_j|^2 up to row and column constants: -<a_i, R b_j>
        cost = -(A @ (B[owner[active]] @ R[active].mT).mT)
        keep, perms = [], []
        for t, c in zip(active, cost):
            perm = assignment(c, groups)
            key, done = perm.tobytes(), seen[owner[t]]
            if key not in done:
                done.add(key)
                keep.append(t)
                perms.append(perm)
        if not keep:
            break
        active, own = np.array(keep), owner[keep]
        Bp = B[own[:, None], np.stack(perms)]  # (K, n, 3), row i matched with A[i]
        R[active] = procrustes(A, Bp, reflections).mT  # R maximizes tr(R Bp^T A)
        err = ((A - Bp @ R[active].mT) ** 2).sum((1, 2))
        for e, o, perm, t in zip(err, own, perms, active):
            if e < best_err[o]:
                best_err[o], best_perm[o], best_R[o] = e, perm, R[t]
    return best_perm, best_R, best_err


def _as_cloud(A, name: str) -> np.ndarray:
    a = np.asarray(A, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3 or a.shape[0] < 1:
        raise ValueError(f"{name} must have shape (n, 3), got {np.shape(A)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} has non-finite values")
    return a


def superpose(
    A,
    B,
    reflections: bool = True,
    restarts: int = 64,
    *,
    seed: int = 0,
    max_iter: int = 100,
    labels=None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Best-RMSD superposition of point set ``B`` onto ``A`` with unknown correspondence:
    the alignment of evaluation (e.g. a generated molecule against a training one).

    Minimizes ``sqrt(mean_i |a_i - R b_perm[i]|^2)`` over atom permutations ``perm`` and
    orthogonal ``R`` (after centring both sets) by alternating the optimal assignment for
    fixed ``R`` (`assignment`, on squared distances) and the optimal ``R`` for a fixed
    assignment (`procrustes`). Each alternation only reaches a local optimum, so it is run
    from B's principal axes mapped onto A's under all 48 signed axis permutations (24 when
    ``reflections=False``) plus ``restarts`` random orthogonal frames (fixed ``seed``), and
    the best result is kept. Deterministic. The result is the best local optimum found,
    not a certified global one; more ``restarts`` can only lower it.

    Reflections are allowed by default because the models' densities are O(3)-invariant: a
    generated molecule and its mirror image are equally likely, so mirror images count as
    the same shape. Pass ``reflections=False`` to restrict ``R`` to rotations.

    Args:
        A (ArrayLike): reference points, shape=[n, 3] (Å).
        B (ArrayLike): points to move, shape=[n, 3], atoms in any order.
        reflections: allow ``det R = -1``.
        restarts: random starting frames on top of the principal-axes frames.
        seed: seed of the random starting frames.
        max_iter: cap on alternations per start.
        labels (ArrayLike | None): optional integer labels, shape=[n] (e.g. atomic numbers),
            the same for the atoms of A and B: only atoms of equal labels are matched.

    Returns:
        ``B_aligned``: shape=[n, 3], ``B[perm]`` centred, transformed by ``R`` and moved to
        A's centroid, so row ``i`` is matched with ``A[i]``; ``perm``: int64 shape=[n];
        ``rmsd``: float, in the units of the inputs.
    """
    A, B = _as_cloud(A, "A"), _as_cloud(B, "B")
    if A.shape != B.shape:
        raise ValueError(f"A and B must have the same shape, got {A.shape} and {B.shape}")
    a0 = A.mean(0)
    A, B = A - a0, B - B.mean(0)
    (perm,), (R,), (err,) = superpose_batch(A, B[None], reflections, restarts, seed, max_iter,
                                            labels=labels)  # fmt: skip
    return B[perm] @ R.T + a0, perm, float(np.sqrt(max(err, 0.0) / len(A)))
