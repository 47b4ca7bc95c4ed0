"""Sample-quality metrics: on Gr(k, D), distance histograms, nearest training molecules
(by the aligned RMSD of `grassflow.manifolds.alignment.superpose`), contacts, bonds kept,
Boltzmann-generator metrics (energy W1, importance weights, ESS); chemistry of one
molecule's conformers (MMFF94 energies, torsions, stereo; needs RDKit when called)."""
from .boltzmann import (
    boltzmann_weights,
    effective_sample_size,
    energy_w1,
    ess_fraction,
    finite_energies,
    log_importance_weights,
)
from .bonds import (
    angle_triples,
    bond_angle_error,
    bond_angles,
    bond_lengths,
    bonds_kept,
    bonds_kept_fraction,
)
from .chemistry import (
    alanine_dipeptide_phi_psi,
    chemistry_summary,
    dihedrals,
    energy_cap,
    energy_w1_capped,
    half_split,
    mmff_energies,
    reference_stereo,
    stereo_elements,
    stereo_kept,
    stereo_signature,
    template_from_molblock,
    template_from_smiles,
    torsion_jsd,
    torsion_quads,
)
from .contacts import closest_pair_fraction
from .histograms import distance_histogram, histogram, jsd
from .mmd import median_bandwidth, mmd2, pairwise_chordal_dist2
from .nearest import nearest, shape_descriptor
from .summary import mean_sem

__all__ = [
    "alanine_dipeptide_phi_psi",
    "angle_triples",
    "bond_angle_error",
    "bond_angles",
    "bond_lengths",
    "bonds_kept",
    "bonds_kept_fraction",
    "boltzmann_weights",
    "chemistry_summary",
    "closest_pair_fraction",
    "dihedrals",
    "distance_histogram",
    "effective_sample_size",
    "energy_cap",
    "energy_w1",
    "energy_w1_capped",
    "ess_fraction",
    "finite_energies",
    "half_split",
    "histogram",
    "jsd",
    "log_importance_weights",
    "mean_sem",
    "median_bandwidth",
    "mmd2",
    "mmff_energies",
    "nearest",
    "pairwise_chordal_dist2",
    "reference_stereo",
    "shape_descriptor",
    "stereo_elements",
    "stereo_kept",
    "stereo_signature",
    "template_from_molblock",
    "template_from_smiles",
    "torsion_jsd",
    "torsion_quads",
]
