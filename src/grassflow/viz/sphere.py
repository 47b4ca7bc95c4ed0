"""Drawing Gr(1, 3) on the unit sphere: points and densities on a 3-D axis.

The paper's multi-panel figures built from these are in `figures`.

A line ``[y]`` is drawn as the antipodal pair ``+-y``. Figures are built on
``matplotlib.figure.Figure`` directly (Agg canvas), never through pyplot, so nothing
opens a window and no global backend is changed.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.1 and Appendix (prior density figure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from matplotlib import colormaps
from torch import Tensor

__all__ = ["plot_density", "plot_points", "sphere_grid"]

LogProbFn = Callable[[Tensor], Tensor]
PANEL_INCHES = 2.2  # inches per sphere panel
DPI = 120


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
        ax (Axes3D): a 3-D axes (``fig.add_subplot(projection="3d")``).
        Y: ``(N, 3, 1)`` or ``(N, 3)`` representatives (normalized here for drawing).
        antipodal: also draw ``-y`` (the full line); ``False`` shows the given representative.
        color (str | tuple[float, ...]): matplotlib colour of the points.
        s: marker size.
        alpha: opacity of the points.
        elev: camera elevation in degrees.
        azim: camera azimuth in degrees.
        hide_back: skip points on the far side of the sphere, which matplotlib cannot occlude.
        sphere_color (str | tuple[float, ...]): matplotlib colour of the sphere surface.
        sphere_alpha: opacity of the sphere surface.
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
def eval_density(
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
        ax (Axes3D): a 3-D axes.
        log_prob_fn: maps ``(N, 3, 1)`` to ``(N,)``. A density on Gr(1, 3) is even,
            ``p(y) = p(-y)``; it is evaluated as given (not symmetrized), so an asymmetric
            picture exposes a model that is not a density on Gr(1, 3).
        n: ``(n_lat, n_lon)`` of the evaluation grid.
        elev: camera elevation in degrees.
        azim: camera azimuth in degrees.
        cmap: matplotlib colormap name.
        vmax: density mapped to the brightest colour; default the grid maximum.
        chunk: grid points per ``log_prob_fn`` call.
        dtype: of the points passed to ``log_prob_fn``; default torch's default dtype.
        device: of the points passed to ``log_prob_fn``.

    Returns:
        The density on the grid, ``(n_lat, n_lon)``.
    """
    g = sphere_grid(*n)
    dens = eval_density(log_prob_fn, g, chunk, dtype or torch.get_default_dtype(), device)
    draw_density(ax, g, dens, elev, azim, cmap, vmax)
    return dens


def draw_density(
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
