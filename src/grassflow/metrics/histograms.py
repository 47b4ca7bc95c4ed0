"""Histogram distances: Jensen-Shannon divergence of binned samples (E-NF's JSD metric)."""

from __future__ import annotations

import numpy as np

__all__ = ["distance_histogram", "histogram", "jsd"]


def histogram(values: np.ndarray, bins: int, lo: float, hi: float) -> np.ndarray:
    """Counts of ``values`` in ``bins`` equal bins on ``[lo, hi]``; values past ``hi`` go
    to the last bin and values below ``lo`` to the first (as E-NF's ``Histogram_cont``)."""
    idx = np.clip(((np.asarray(values) - lo) / (hi - lo) * bins).astype(np.int64), 0, bins - 1)
    return np.bincount(idx.ravel(), minlength=bins).astype(np.float64)


def jsd(p: np.ndarray, q: np.ndarray, eps: float = 1e-10) -> float:
    """Jensen-Shannon divergence (natural log) of two histograms of equal length.

    Both are normalized to sum 1, ``eps`` is added to every bin (so empty bins stay finite)
    and they are normalized again. 0 for identical histograms, at most log 2.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"histograms must be 1-D of equal length, got {p.shape} and {q.shape}")
    if (p < 0).any() or (q < 0).any() or p.sum() <= 0 or q.sum() <= 0:
        raise ValueError("histograms must be non-negative with a positive total")
    p = p / p.sum() + eps
    q = q / q.sum() + eps
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)
    return float(0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m)))


def distance_histogram(
    P: np.ndarray, bins: int = 100, lo: float = 0.0, hi: float = 13.0, chunk: int = 4096
) -> np.ndarray:
    """Counts of interatomic distances, binned as E-NF's QM9 metric.

    Every ordered pair ``i != j`` of every configuration counts once (so each distance
    twice); zero distances are dropped; a distance ``d`` goes to bin
    ``min(int((d - lo) / (hi - lo) * bins), bins - 1)``, as ``Histogram_cont`` in E-NF.

    Args:
        P: ``(N, n, 3)`` positions in Å.
        bins: number of equal bins on ``[lo, hi]``; E-NF uses 100 bins on [0, 13] Å.
        lo: lower end of the binned range, in Å.
        hi: upper end of the binned range, in Å.
        chunk: configurations per batch (bounds memory at ``chunk * n * n`` distances).

    Returns:
        float64 ``(bins,)`` counts; compare with `jsd`.
    """
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 3:
        raise ValueError(f"expected positions of shape (N, n, d), got {P.shape}")
    counts = np.zeros(bins)
    for start in range(0, len(P), chunk):
        X = P[start : start + chunk]
        d = np.sqrt(((X[:, :, None, :] - X[:, None, :, :]) ** 2).sum(-1))
        d = d[d > 0]  # the diagonal, and coinciding atoms, as E-NF
        counts += histogram(d, bins, lo, hi)
    return counts
