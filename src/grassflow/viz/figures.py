"""The paper's sphere figures: Figures 3 and 4 and the prior-density figure (Gr(1, 3)).

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.1 and Appendix (prior density figure).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from .sphere import (
    DPI,
    PANEL_INCHES,
    LogProbFn,
    draw_density,
    eval_density,
    plot_density,
    plot_points,
    sphere_grid,
)

__all__ = ["SphereColumn", "figure_antipodal", "figure_prior_views", "figure_textures"]


def _save(fig: Figure, path: str | os.PathLike) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")


def figure_prior_views(
    log_prob_fn: LogProbFn,
    path: str | os.PathLike,
    azims: Sequence[float] = (0, 30, 60, 90, 120, 150),
    *,
    elev: float = 30.0,
    base_azim: float = 0.0,
    n: tuple[int, int] = (60, 120),
    cmap: str = "inferno",
    chunk: int = 4096,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> None:
    """The appendix prior figure: one sphere per view, the camera rotated about z.

    Panel i looks from azimuth ``base_azim - azims[i]`` (clockwise seen from +z), so with
    M = e1 the first panel faces M and the last mostly shows -M. All panels share one
    colour scale (the density is evaluated once).

    Args:
        log_prob_fn: ``(N, 3, 1) -> (N,)``, e.g. ``MatrixGaussianPrior(...).log_prob``.
        path: output PNG.
        azims: rotations in degrees.
        elev: camera elevation in degrees.
        n: density grid ``(n_lat, n_lon)``.
        cmap: matplotlib colormap name (as in `plot_density`).
        chunk: grid points per ``log_prob_fn`` call.
        dtype: of the points passed to ``log_prob_fn``; default torch's default dtype.
        device: of the points passed to ``log_prob_fn``.
    """
    # the density does not depend on the view: evaluate once, draw every panel from it
    g = sphere_grid(*n)
    dens = eval_density(log_prob_fn, g, chunk, dtype or torch.get_default_dtype(), device)
    fig = Figure(figsize=(PANEL_INCHES * len(azims), PANEL_INCHES))
    for i, a in enumerate(azims):
        ax = fig.add_subplot(1, len(azims), i + 1, projection="3d")
        draw_density(ax, g, dens, elev, base_azim - a, cmap, None)
        ax.set_title(f"{a:g}°", fontsize=9)
    _save(fig, path)


@dataclass
class SphereColumn:
    """One column of `figure_textures`; every entry is optional.

    Attributes:
        title: column header, e.g. ``"2 spirals"``.
        data: ``(N, 3, 1)`` training samples (row "Data").
        generated: ``(N, 3, 1)`` model samples (row "Generated").
        log_prob_fn: ``(N, 3, 1) -> (N,)`` model density (row "Density").
    """

    title: str = ""
    data: Tensor | np.ndarray | None = None
    generated: Tensor | np.ndarray | None = None
    log_prob_fn: LogProbFn | None = None


_ROWS = (("data", "Data"), ("generated", "Generated"), ("log_prob_fn", "Density"))


def figure_textures(
    columns: Sequence[SphereColumn | Mapping],
    path: str | os.PathLike,
    *,
    elev: float = 30.0,
    azim: float = 0.0,
    n: tuple[int, int] = (60, 120),
    s: float = 1.5,
    dtype: torch.dtype | None = None,
) -> None:
    """Paper Figure 3: columns (prior, then datasets) by rows Data / Generated / Density.

    A row is drawn when at least one column has that entry; missing cells stay blank.

    Args:
        columns: `SphereColumn` or mappings with the same keys.
        path: output PNG.
        elev: camera elevation in degrees, the same for every panel.
        azim: camera azimuth in degrees, the same for every panel.
        n: density grid ``(n_lat, n_lon)``.
        s: marker size.
        dtype: of the points passed to each ``log_prob_fn``.
    """
    cols = [c if isinstance(c, SphereColumn) else SphereColumn(**c) for c in columns]
    if not cols:
        raise ValueError("figure_textures needs at least one column")
    rows = [(key, label) for key, label in _ROWS if any(getattr(c, key) is not None for c in cols)]
    if not rows:
        raise ValueError("no column has data, generated or log_prob_fn")
    fig = Figure(figsize=(PANEL_INCHES * len(cols), PANEL_INCHES * len(rows)))
    for r, (key, label) in enumerate(rows):
        for j, col in enumerate(cols):
            ax = fig.add_subplot(len(rows), len(cols), r * len(cols) + j + 1, projection="3d")
            ax.set_axis_off()
            value = getattr(col, key)
            if key == "log_prob_fn" and value is not None:
                plot_density(ax, value, n, elev=elev, azim=azim, dtype=dtype)
            elif value is not None:
                color = "C0" if key == "data" else "C3"
                plot_points(ax, value, color=color, s=s, elev=elev, azim=azim)
            if r == 0:
                ax.set_title(col.title, fontsize=10)
            if j == 0:
                ax.text2D(-0.02, 0.5, label, transform=ax.transAxes, rotation=90,
                          va="center", ha="right", fontsize=10, fontweight="bold")
    _save(fig, path)


def figure_antipodal(
    neg_prior: Tensor | np.ndarray,
    generated: Mapping[str, Tensor | np.ndarray],
    path: str | os.PathLike,
    *,
    elev: float = -30.0,
    azim: float = 180.0,
    s: float = 1.5,
) -> None:
    """Paper Figure 4: the flow applied to the antipodes ``-Y0`` of prior samples.

    Only the given representatives are drawn (no antipodes), from below the equator on
    the -e1 side, so the panels show where the flow sends the untrained representatives.

    Args:
        neg_prior: ``(N, 3, 1)`` negated prior samples ``-Y0`` (leftmost panel).
        generated: ``{title: (N, 3, 1)}`` flow outputs from ``-Y0``, one panel each.
        path: output PNG.
        elev: camera elevation in degrees (default: southern hemisphere).
        azim: camera azimuth in degrees (default: facing -e1).
        s: marker size.
    """
    panels = [("Prior (antipodal)", neg_prior, "0.3")]
    panels += [(title, Y, "C3") for title, Y in generated.items()]
    fig = Figure(figsize=(PANEL_INCHES * len(panels), PANEL_INCHES))
    for i, (title, Y, color) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
        plot_points(ax, Y, antipodal=False, color=color, s=s, elev=elev, azim=azim)
        ax.set_title(title, fontsize=10)
    _save(fig, path)
