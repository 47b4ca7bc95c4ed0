"""Pictures: Gr(1, 3) samples and densities on the unit sphere; QM9 molecules; energy
histograms; conformers of one molecule (energies, torsions, Ramachandran plots)."""

from .conformer_plots import plot_conformer_energies, plot_ramachandran, plot_torsions
from .energies import draw_histograms, plot_energy_histograms
from .figures import SphereColumn, figure_antipodal, figure_prior_views, figure_textures
from .molecules import plot_nearest
from .sphere import plot_density, plot_points, sphere_grid

__all__ = [
    "SphereColumn",
    "draw_histograms",
    "figure_antipodal",
    "figure_prior_views",
    "figure_textures",
    "plot_conformer_energies",
    "plot_density",
    "plot_energy_histograms",
    "plot_nearest",
    "plot_points",
    "plot_ramachandran",
    "plot_torsions",
    "sphere_grid",
]
