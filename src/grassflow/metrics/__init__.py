"""Sample-quality metrics: on Gr(k, D), distance histograms, molecule alignment, contacts."""

from .alignment import align, nearest, shape_descriptor
from .contacts import closest_pair_fraction
from .histograms import histogram, jsd
from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2
from .summary import mean_sem

__all__ = [
    "align",
    "closest_pair_fraction",
    "histogram",
    "jsd",
    "mean_sem",
    "median_bandwidth",
    "mmd2",
    "nearest",
    "pairwise_chordal_dist2",
    "shape_descriptor",
]
