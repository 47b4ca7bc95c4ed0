"""Covalent bonds of generated molecules: lengths, and whether a sample keeps all of them.

A shape model trained with element labels treats atoms of the same element as exchangeable,
so a generated molecule's atom order within an element is arbitrary: before its bonds can be
measured, its atoms are matched to the molecule's by label-restricted alignment
(`grassflow.manifolds.alignment.superpose` with ``labels``) onto reference conformers.
"""

from __future__ import annotations

import numpy as np

from ..manifolds.alignment import assignment, label_groups, superpose_batch

__all__ = ["angle_triples", "bond_angles", "bond_angle_error", "bond_lengths", "bonds_kept",
           "bonds_kept_fraction"]  # fmt: skip


def _numpy(X) -> np.ndarray:
    return np.asarray(X.detach().cpu() if hasattr(X, "detach") else X, dtype=np.float64)


def _check(X, bonds) -> tuple[np.ndarray, np.ndarray]:
    X, b = _numpy(X), np.asarray(bonds)
    if X.ndim != 3 or X.shape[0] < 1 or X.shape[1] < 2 or X.shape[2] != 3:
        raise ValueError(f"X must be (N, n, 3) clouds with N >= 1 and n >= 2, got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X holds NaN or inf")
    if b.ndim != 2 or b.shape[1] != 2 or not np.issubdtype(b.dtype, np.integer) or len(b) < 1:
        raise ValueError(f"bonds must be (B, 2) integer pairs with B >= 1, got {b.dtype} "
                         f"of shape {b.shape}")  # fmt: skip
    if b.min() < 0 or b.max() >= X.shape[1] or (b[:, 0] == b[:, 1]).any():
        raise ValueError(f"bonds must pair distinct atoms in [0, {X.shape[1]}), got {b.tolist()}")
    return X, b


def bond_lengths(X, bonds) -> np.ndarray:
    """Lengths ``|x_i - x_j|`` of the bonds ``(i, j)`` in every cloud.

    Args:
        X (ArrayLike): tensor or ndarray, shape=[N, n, 3].
        bonds (ArrayLike): integer atom index pairs, shape=[B, 2].

    Returns:
        float64, shape=[N, B].
    """
    X, b = _check(X, bonds)
    return np.linalg.norm(X[:, b[:, 0]] - X[:, b[:, 1]], axis=-1)


def angle_triples(bonds, n: int) -> np.ndarray:
    """The bond angles of a bond graph on n atoms: ``(A, 3)`` int64 triples ``(i, j, k)``,
    ``i < k``, with j bonded to both (j is the vertex), sorted."""
    b = np.asarray(bonds, dtype=np.int64)
    neighbours: list[list[int]] = [[] for _ in range(n)]
    for i, j in b.tolist():
        neighbours[i].append(j)
        neighbours[j].append(i)
    out = [(i, j, k) for j in range(n) for i in sorted(neighbours[j])
           for k in sorted(neighbours[j]) if i < k]  # fmt: skip
    return np.array(sorted(out), dtype=np.int64).reshape(-1, 3)


def bond_angles(X, bonds) -> np.ndarray:
    """Every bond angle (`angle_triples`) of every cloud, in degrees.

    Args:
        X (ArrayLike): tensor or ndarray, shape=[N, n, 3].
        bonds (ArrayLike): integer atom index pairs, shape=[B, 2].

    Returns:
        float64, shape=[N, A]; a zero-length bond gives NaN.
    """
    X, b = _check(X, bonds)
    t = angle_triples(b, X.shape[1])
    u, v = X[:, t[:, 0]] - X[:, t[:, 1]], X[:, t[:, 2]] - X[:, t[:, 1]]
    with np.errstate(invalid="ignore", divide="ignore"):
        c = (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))
    return np.degrees(np.arccos(np.clip(c, -1.0, 1.0)))


def bond_angle_error(X, X_ref, bonds) -> float:
    """Mean absolute deviation (degrees) of the clouds' bond angles from the reference
    conformers' mean angles, over angles and clouds (atom order fixed, no matching); NaN
    angles (zero-length bonds) count as 180 degrees off."""
    a, ref = bond_angles(X, bonds), bond_angles(X_ref, bonds)
    if a.shape[1] == 0:
        raise ValueError("the bond graph has no bond angles (no atom with two bonds)")
    return float(np.nan_to_num(np.abs(a - np.nanmean(ref, axis=0)), nan=180.0).mean())


def _refine(X, perm, b, l0, groups, rounds) -> np.ndarray:
    """Re-match each label group of ``X: (N, n, 3)`` given the rest of ``perm: (N, n)``.

    Slot i (the molecule's atom i) costs ``sum_k (|x_j - x_perm[k]| / l0_ik - 1)^2`` over
    its bonds (i, k) when given the sample's atom j; a Hungarian solve per group and sample,
    repeated until nothing changes or for ``rounds`` sweeps. RMSD alignment to a conformer in
    another rotamer can hand a hydrogen to the wrong carbon; this puts it back.
    """
    rows = np.arange(len(X))[:, None]
    for _ in range(rounds):
        M = X[rows, perm]  # (N, n, 3): the sample's atom matched to each slot
        d = np.linalg.norm(X[:, :, None] - M[:, None], axis=-1)  # (N, j, k): |x_j - M_k|
        cost = np.zeros_like(d)  # (N, i, j)
        for (p, q), length in zip(b, l0):  # slot p pays for its bond to q's match, q for p's
            cost[:, p] += (d[:, :, q] / length - 1) ** 2
            cost[:, q] += (d[:, :, p] / length - 1) ** 2
        new = np.stack([assignment(c, groups) for c in cost])
        if (new == perm).all():
            break
        perm = new
    return perm


def bonds_kept(
    X, bonds, reference_lengths, tol: float = 0.1, labels=None, reference=None, rounds: int = 10
) -> np.ndarray:
    """Whether each cloud keeps every bond within ``tol`` of its reference length.

    Sample ``m`` keeps its bonds when ``|l_ij(m) / l0_ij - 1| <= tol`` for every bond ``(i, j)``,
    where ``l0`` are ``reference_lengths`` (e.g. the mean lengths in the data) and ``l_ij(m)``
    is the distance between the sample's atoms matched to atoms i and j:

    - ``labels=None``: the sample's atom ``i`` is atom ``i`` (its order is the molecule's);
    - with ``labels``: the sample's atoms are matched to the molecule's, within each label
      (element), in two steps per reference conformer: (1) alternating Hungarian assignment
      and Kabsch superposition onto the reference (reflections allowed, as the models are
      reflection invariant; at most ``rounds`` alternations from each of the 8 sign choices
      of the principal axes, the lowest-RMSD match kept); (2) at most ``rounds`` sweeps
      re-matching each label group by its bond-length misfit to the rest of the match
      (`_refine`). The sample counts as kept if the match from any reference keeps
      every bond. Both steps are local searches, so this is a lower bound on the fraction
      of samples that are the molecule's graph up to relabelling atoms of the same element
      (the quantity meant); more diverse references raise it towards that. One reference in
      another rotamer can match the molecule backwards (alanine dipeptide: acetyl onto
      N-methyl), so pass several: on shuffled data conformers (alanine dipeptide, n-butane,
      glycerol) 2-3 references from different chains recover the unshuffled fraction.

    Args:
        X (ArrayLike): sampled clouds, shape=[N, n, 3] (Å), any translation, rotation or
            reflection.
        bonds (ArrayLike): integer atom index pairs of the molecule, shape=[B, 2].
        reference_lengths (ArrayLike): shape=[B], > 0.
        tol: relative tolerance, > 0.
        labels (ArrayLike | None): integer per-atom labels of the molecule, shape=[n] (e.g.
            atomic numbers).
        reference (ArrayLike | None): conformers of the molecule in its atom order, shape=[n, 3]
            or [R, n, 3]; needed with ``labels``.
        rounds: alternations of the matching per start.

    Returns:
        bool, shape=[N].
    """
    X, b = _check(X, bonds)
    l0 = np.asarray(reference_lengths, dtype=np.float64)
    if l0.shape != (len(b),) or not (np.isfinite(l0).all() and (l0 > 0).all()):
        raise ValueError(f"reference_lengths must be {len(b)} finite lengths > 0, got {l0}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if labels is None:
        return (np.abs(bond_lengths(X, b) / l0 - 1) <= tol).all(1)
    if reference is None:
        raise ValueError("matching atoms by labels needs reference conformers: pass reference")
    refs = _numpy(reference)
    refs = refs[None] if refs.ndim == 2 else refs
    if refs.ndim != 3 or refs.shape[1:] != X.shape[1:] or not np.isfinite(refs).all():
        raise ValueError(f"reference must be finite (n, 3) or (R, n, 3) with n = {X.shape[1]}, "
                         f"got {refs.shape}")  # fmt: skip
    Xc = X - X.mean(1, keepdims=True)
    groups = label_groups(labels, X.shape[1])
    kept = np.zeros(len(X), bool)
    for A in refs:  # the next reference tries only the samples not matched yet
        todo = np.flatnonzero(~kept)
        if not len(todo):
            break
        # starts: the 8 sign choices of the principal axes (reflections included); more
        # references help more than the 48 axis permutations, at a sixth of the cost
        perm = superpose_batch(A - A.mean(0), Xc[todo], True, 0, 0, rounds, False, labels)[0]
        perm = _refine(X[todo], perm, b, l0, groups, rounds)
        matched = np.take_along_axis(X[todo], perm[..., None], 1)  # row i: atom i's match
        kept[todo] = (np.abs(bond_lengths(matched, b) / l0 - 1) <= tol).all(1)
    return kept


def bonds_kept_fraction(
    X, bonds, reference_lengths, tol: float = 0.1, labels=None, reference=None, rounds: int = 10
) -> float:
    """The fraction of the N clouds that keep every bond: the mean of `bonds_kept`
    (same arguments), in [0, 1]."""
    return float(bonds_kept(X, bonds, reference_lengths, tol, labels, reference, rounds).mean())
