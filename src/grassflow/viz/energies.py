"""Histograms of per-sample scalars (energies, pair distances) of several sample sets.

Built on ``matplotlib.figure.Figure`` (Agg canvas), never through pyplot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["draw_histograms", "plot_energy_histograms"]

_DPI = 120


def _flat(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().numpy()
    return np.asarray(values, dtype=np.float64).ravel()


def draw_histograms(
    ax: Axes,
    samples: Mapping[str, np.ndarray],
    *,
    bins: int = 100,
    limits: tuple[float, float] | None = None,
    log_density: bool = False,
    xlabel: str = "energy",
) -> None:
    """Draw one step histogram (normalized to a density) per entry of ``samples`` on ``ax``.

    All sets share the same bins; non-finite values are left out and their count is
    added to the legend.

    Args:
        ax: the axes to draw on.
        samples: label -> ``(N,)`` values (any shape is flattened), arrays or tensors.
        bins: number of equal bins.
        limits: ``(lo, hi)`` of the bins; default the 0.1 % and 99.9 % quantiles of the
            pooled finite values (so a few outliers do not squash the plot).
        log_density: log scale on the y axis.
        xlabel: label of the x axis.
    """
    flat = {k: _flat(v) for k, v in samples.items()}
    finite = {k: v[np.isfinite(v)] for k, v in flat.items()}
    if limits is None:
        pooled = np.concatenate([v for v in finite.values() if v.size] or [np.zeros(1)])
        limits = tuple(np.quantile(pooled, [0.001, 0.999]))
    edges = np.linspace(*limits, bins + 1)
    for label, v in finite.items():
        dropped = flat[label].size - v.size
        suffix = f" ({dropped} non-finite)" if dropped else ""
        ax.hist(v, bins=edges, density=True, histtype="step", lw=1.5, label=label + suffix)
    if log_density:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.legend(fontsize=8)


def plot_energy_histograms(
    energies: Mapping[str, np.ndarray],
    path: str | os.PathLike,
    title: str = "",
    *,
    bins: int = 100,
    limits: tuple[float, float] | None = None,
    log_density: bool = False,
) -> Figure:
    """Energy histograms of several sample sets (e.g. model samples vs data) in one PNG.

    Args:
        energies: label -> ``(N,)`` energies.
        path: output PNG (parent folders are created).
        title: figure title.
        bins: number of equal bins (as in `draw_histograms`).
        limits: ``(lo, hi)`` of the bins (as in `draw_histograms`).
        log_density: log scale on the y axis.

    Returns:
        The figure (already saved).
    """
    fig = Figure(figsize=(5.0, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    draw_histograms(ax, energies, bins=bins, limits=limits, log_density=log_density)
    if title:
        ax.set_title(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return fig
