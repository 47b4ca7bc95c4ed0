"""Sample-quality metrics: on Gr(k, D), distance histograms, molecule alignment."""

from .alignment import align, nearest, shape_descriptor
from .histograms import histogram, jsd
from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2

__all__ = [
    "align",
    "histogram",
    "jsd",
    "median_bandwidth",
    "mmd2",
    "nearest",
    "pairwise_chordal_dist2",
    "shape_descriptor",
]
