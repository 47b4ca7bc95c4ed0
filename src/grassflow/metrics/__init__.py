"""Sample-quality metrics on Gr(k, D)."""

from .histograms import histogram, jsd
from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2

__all__ = ["histogram", "jsd", "median_bandwidth", "mmd2", "pairwise_chordal_dist2"]
