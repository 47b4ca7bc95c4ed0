"""Pictures: Gr(1, 3) samples and densities on the unit sphere."""

from .figures import SphereColumn, figure_antipodal, figure_prior_views, figure_textures
from .sphere import plot_density, plot_points, sphere_grid

__all__ = [
    "SphereColumn",
    "figure_antipodal",
    "figure_prior_views",
    "figure_textures",
    "plot_density",
    "plot_points",
    "sphere_grid",
]
