"""Pictures of Gr(1, 3) on the unit sphere (paper Figs. 3, 4 and the prior figure).

A line ``[y]`` is drawn as the antipodal pair ``+-y``. Figures are built on
``matplotlib.figure.Figure`` directly (Agg canvas), never through pyplot, so nothing
opens a window and no global backend is changed.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.1 and Appendix (prior density figure).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

__all__ = [
    "SphereColumn",
    "figure_antipodal",
    "figure_prior_views",
    "figure_textures",
    "plot_density",
    "plot_points",
    "sphere_grid",
]

LogProbFn = Callable[[Tensor], Tensor]
_CELL = 2.2  # inches per sphere panel
_DPI = 120


def sphere_grid(n_lat: int = 60, n_lon: int = 120) -> np.ndarray:
    """Unit vectors on a closed latitude-longitude grid, ``(n_lat, n_lon, 3)`` float64.

    Latitude runs from the north pole to the south pole and longitude over [0, 2 pi]
    inclusive, so the grid can be passed straight to ``plot_surface``.
    """
    if n_lat < 2 or n_lon < 3:
        raise ValueError(f"need n_lat >= 2 and n_lon >= 3, got {n_lat}, {n_lon}")
    theta = np.linspace(0.0, np.pi, n_lat)[:, None]
    phi = np.linspace(0.0, 2.0 * np.pi, n_lon)[None, :]
    xyz = np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)
    return np.stack(np.broadcast_arrays(*xyz), -1)


def _view_dir(elev: float, azim: float) -> np.ndarray:
    """Unit vector from the origin towards matplotlib's camera for ``view_init(elev, azim)``."""
    e, a = np.deg2rad(elev), np.deg2rad(azim)
    return np.array([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)])


def _setup(ax, elev: float, azim: float) -> None:
    ax.view_init(elev=elev, azim=azim)
    ax.set_xlim(-1, 1), ax.set_ylim(-1, 1), ax.set_zlim(-1, 1)
    ax.set_box_aspect((1, 1, 1), zoom=1.35)
    ax.set_axis_off()
    # draw in call order (sphere, then points): mplot3d's depth sort mixes them up
    ax.computed_zorder = False


def _as_vectors(Y: Tensor | np.ndarray) -> np.ndarray:
    y = Y.detach().cpu().numpy() if isinstance(Y, Tensor) else np.asarray(Y)
    if y.ndim == 3 and y.shape[-1] == 1:
        y = y[..., 0]
    if y.ndim != 2 or y.shape[1] != 3:
        raise ValueError(f"Y must have shape (N, 3, 1) or (N, 3), got {np.shape(Y)}")
    return y.astype(np.float64)


def plot_points(
    ax,
    Y: Tensor | np.ndarray,
    *,
    antipodal: bool = True,
    color="C0",
    s: float = 2.0,
    alpha: float = 0.8,
    elev: float = 30.0,
    azim: float = 0.0,
    hide_back: bool = True,
    sphere_color="0.85",
    sphere_alpha: float = 0.25,
) -> None:
    """Scatter Gr(1, 3) points on a semi-transparent unit sphere.

    Args:
        ax: a 3-D axes (``fig.add_subplot(projection="3d")``).
        Y: ``(N, 3, 1)`` or ``(N, 3)`` representatives (normalized here for drawing).
        antipodal: also draw ``-y`` (the full line); ``False`` shows the given representative.
        color, s, alpha: scatter style.
        elev, azim: camera angles in degrees.
        hide_back: skip points on the far side of the sphere, which matplotlib cannot occlude.
        sphere_color, sphere_alpha: style of the sphere surface.
    """
    y = _as_vectors(Y)
    y = y / np.linalg.norm(y, axis=1, keepdims=True).clip(1e-12)
    if antipodal:
        y = np.concatenate([y, -y], 0)
    _setup(ax, elev, azim)
    g = sphere_grid(20, 40)
    ax.plot_surface(
        g[..., 0], g[..., 1], g[..., 2], color=sphere_color, alpha=sphere_alpha,
        linewidth=0, shade=False, zorder=1,
    )
    if hide_back:
        y = y[y @ _view_dir(elev, azim) > 0]
    # pushed a hair off the surface so that points are not half-buried in the sphere
    y = 1.01 * y
    ax.scatter(y[:, 0], y[:, 1], y[:, 2], color=color, s=s, alpha=alpha, linewidths=0, zorder=2)


@torch.no_grad()
def _eval_density(
    log_prob_fn: LogProbFn, pts: np.ndarray, chunk: int, dtype: torch.dtype, device
) -> np.ndarray:
    flat = torch.as_tensor(pts.reshape(-1, 3), dtype=dtype, device=device).unsqueeze(-1)
    out = []
    for start in range(0, flat.shape[0], chunk):
        lp = log_prob_fn(flat[start : start + chunk])
        if lp.shape != flat[start : start + chunk].shape[:1]:
            raise ValueError(f"log_prob_fn must return shape (N,), got {tuple(lp.shape)}")
        out.append(lp.double().exp().cpu())
    dens = torch.cat(out).numpy().reshape(pts.shape[:-1])
    if np.isnan(dens).any() or np.isposinf(dens).any():
        raise ValueError("log_prob_fn returned NaN or +inf on the sphere grid")
    return dens


def plot_density(
    ax,
    log_prob_fn: LogProbFn,
    n: tuple[int, int] = (60, 120),
    *,
    elev: float = 30.0,
    azim: float = 0.0,
    cmap: str = "inferno",
    vmax: float | None = None,
    chunk: int = 4096,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """Colour the unit sphere by the density ``exp(log_prob_fn(y))``; brighter is higher.

    Args:
        ax: a 3-D axes.
        log_prob_fn: maps ``(N, 3, 1)`` to ``(N,)``. A density on Gr(1, 3) is even,
            ``p(y) = p(-y)``; it is evaluated as given (not symmetrized), so an asymmetric
            picture exposes a model that is not a density on Gr(1, 3).
        n: ``(n_lat, n_lon)`` of the evaluation grid.
        elev, azim: camera angles in degrees.
        cmap: matplotlib colormap name.
        vmax: density mapped to the brightest colour; default the grid maximum.
        chunk: grid points per ``log_prob_fn`` call.
        dtype, device: of the points passed to ``log_prob_fn``; default torch's default dtype.

    Returns:
        The density on the grid, ``(n_lat, n_lon)``.
    """
    g = sphere_grid(*n)
    dens = _eval_density(log_prob_fn, g, chunk, dtype or torch.get_default_dtype(), device)
    _draw_density(ax, g, dens, elev, azim, cmap, vmax)
    return dens


def _draw_density(
    ax, g: np.ndarray, dens: np.ndarray, elev: float, azim: float, cmap: str, vmax: float | None
) -> None:
    top = float(dens.max()) if vmax is None else float(vmax)
    # a face takes the colour of its first corner; average the four instead
    face = 0.25 * (dens[:-1, :-1] + dens[1:, :-1] + dens[:-1, 1:] + dens[1:, 1:])
    colors = colormaps[cmap](np.clip(face / max(top, 1e-300), 0.0, 1.0))
    _setup(ax, elev, azim)
    ax.plot_surface(
        g[..., 0], g[..., 1], g[..., 2], facecolors=colors, rstride=1, cstride=1,
        linewidth=0, antialiased=False, shade=False, zorder=1,
    )


def _save(fig: Figure, path: str | os.PathLike) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")


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
        cmap, chunk, dtype, device: as in :func:`plot_density`.
    """
    # the density does not depend on the view: evaluate once, draw every panel from it
    g = sphere_grid(*n)
    dens = _eval_density(log_prob_fn, g, chunk, dtype or torch.get_default_dtype(), device)
    fig = Figure(figsize=(_CELL * len(azims), _CELL))
    for i, a in enumerate(azims):
        ax = fig.add_subplot(1, len(azims), i + 1, projection="3d")
        _draw_density(ax, g, dens, elev, base_azim - a, cmap, None)
        ax.set_title(f"{a:g}°", fontsize=9)
    _save(fig, path)


@dataclass
class SphereColumn:
    """One column of :func:`figure_textures`; every entry is optional.

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
        columns: :class:`SphereColumn` or mappings with the same keys.
        path: output PNG.
        elev, azim: one camera for every panel.
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
    fig = Figure(figsize=(_CELL * len(cols), _CELL * len(rows)))
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
        elev, azim: camera angles in degrees (default: southern hemisphere, facing -e1).
        s: marker size.
    """
    panels = [("Prior (antipodal)", neg_prior, "0.3")]
    panels += [(title, Y, "C3") for title, Y in generated.items()]
    fig = Figure(figsize=(_CELL * len(panels), _CELL))
    for i, (title, Y, color) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
        plot_points(ax, Y, antipodal=False, color=color, s=s, elev=elev, azim=azim)
        ax.set_title(title, fontsize=10)
    _save(fig, path)
