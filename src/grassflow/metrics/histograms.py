"""Histogram distances: Jensen-Shannon divergence of binned samples (E-NF's JSD metric)."""

from __future__ import annotations

import numpy as np

__all__ = ["histogram", "jsd"]


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
