"""Broken samples: clouds whose closest pair of points is too near (e.g. atoms < 0.9 Å)."""

from __future__ import annotations

import numpy as np

__all__ = ["closest_pair_fraction"]


def closest_pair_fraction(X, threshold: float = 0.9, exclude=None) -> float:
    """Fraction of clouds whose closest pair of distinct points is nearer than ``threshold``.

    Issue 14's "broken molecule" metric: generated QM9 molecules (Å) with two atoms nearer
    than 0.9 Å; the data have none. With a molecule's bonds as ``exclude``, a steric clash
    only: an O-H bond (0.97 Å) a few per cent short is a bond error, not a clash.

    Args:
        X (ArrayLike): tensor or ndarray, shape=[N, n, d]: N clouds of n >= 2 points.
        threshold: distance, > 0 (strictly nearer counts).
        exclude (ArrayLike | None): point pairs left out, shape=[B, 2] (e.g. bonds).

    Returns:
        The fraction in [0, 1].
    """
    X = np.asarray(X.detach().cpu() if hasattr(X, "detach") else X, dtype=np.float64)
    if X.ndim != 3 or X.shape[0] < 1 or X.shape[1] < 2:
        raise ValueError(f"X must be (N, n, d) clouds with N >= 1 and n >= 2, got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X holds NaN or inf")
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")
    i, j = np.triu_indices(X.shape[1], 1)
    if exclude is not None:
        E = np.asarray(exclude, dtype=np.int64).reshape(-1, 2)
        if ((E < 0) | (E >= X.shape[1])).any():
            raise ValueError(f"exclude must hold point pairs in 0..{X.shape[1] - 1}")
        left = np.zeros((X.shape[1], X.shape[1]), bool)
        left[E[:, 0], E[:, 1]] = left[E[:, 1], E[:, 0]] = True
        i, j = i[~left[i, j]], j[~left[i, j]]
        if not len(i):
            return 0.0
    closest = np.linalg.norm(X[:, i] - X[:, j], axis=-1).min(axis=1)
    return float(np.mean(closest < threshold))
