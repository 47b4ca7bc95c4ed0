"""Pictures: Gr(1, 3) samples and densities on the unit sphere; QM9 molecules."""

from .figures import SphereColumn, figure_antipodal, figure_prior_views, figure_textures
from .molecules import plot_nearest
from .sphere import plot_density, plot_points, sphere_grid

__all__ = [
    "SphereColumn",
    "figure_antipodal",
    "figure_prior_views",
    "figure_textures",
    "plot_density",
    "plot_nearest",
    "plot_points",
    "sphere_grid",
]
