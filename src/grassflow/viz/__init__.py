"""Pictures: Gr(1, 3) samples and densities on the unit sphere; QM9 molecules; energy
histograms."""

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
    "plot_density",
    "plot_energy_histograms",
    "plot_nearest",
    "plot_points",
    "sphere_grid",
]
