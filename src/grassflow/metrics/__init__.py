"""Sample-quality metrics: on Gr(k, D), distance histograms, nearest training molecules
(by the aligned RMSD of `grassflow.manifolds.alignment.superpose`), contacts, bonds kept,
Boltzmann-generator metrics (energy W1, importance weights, ESS)."""
from .boltzmann import (
    effective_sample_size,
    energy_w1,
    finite_energies,
    log_importance_weights,
)
from .bonds import bond_lengths, bonds_kept, bonds_kept_fraction
from .contacts import closest_pair_fraction
from .histograms import distance_histogram, histogram, jsd
from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2
from .nearest import nearest, shape_descriptor
from .summary import mean_sem

__all__ = [
    "bond_lengths",
    "bonds_kept",
    "bonds_kept_fraction",
    "closest_pair_fraction",
    "distance_histogram",
    "effective_sample_size",
    "energy_w1",
    "finite_energies",
    "histogram",
    "jsd",
    "log_importance_weights",
    "mean_sem",
    "median_bandwidth",
    "mmd2",
    "nearest",
    "pairwise_chordal_dist2",
    "shape_descriptor",
]
