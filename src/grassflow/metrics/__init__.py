"""Sample-quality metrics on Gr(k, D)."""

from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2

__all__ = ["median_bandwidth", "mmd2", "pairwise_chordal_dist2"]
