"""Pictures of generated conformers of one molecule against reference conformers: MMFF
energies, torsion histograms, Ramachandran plots (see `grassflow.metrics.chemistry`).

Named ``conformer_plots`` rather than ``chemistry``: no two modules of the package share a
name (``tests/test_layout.py``). Built on ``matplotlib.figure.Figure`` (Agg canvas), never
through pyplot, so nothing stays open.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..metrics.chemistry import dihedrals, energy_cap, torsion_jsd
from ..metrics.histograms import jsd
from .energies import draw_histograms

__all__ = ["plot_conformer_energies", "plot_ramachandran", "plot_torsions"]

_DPI = 110


def _save(fig: Figure, path) -> Path:
    path = Path(path)
    os.makedirs(path.parent.resolve(), exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def plot_conformer_energies(
    E_samples,
    E_ref,
    path: str | os.PathLike,
    labels: tuple[str, str] = ("samples", "reference"),
    bins: int = 60,
    margin: float = 100.0,
    weights=None,
) -> Path:
    """Overlaid MMFF energy histograms (shared bins) of samples and reference in one PNG.

    The bins span the reference energies and the finite sample energies up to the cap of
    `grassflow.metrics.chemistry.energy_cap` ``(E_ref, margin)``; the legend counts the
    non-finite samples and the title the samples above the cap (left out of the picture).
    With ``weights`` (importance weights of the samples, e.g.
    `grassflow.metrics.boltzmann.boltzmann_weights`), the reweighted histogram of the same
    samples is drawn too, over the same shown range (the title gives the share of the weight
    above the cap).

    Args:
        E_samples (ArrayLike): kcal/mol, shape=[N].
        E_ref (ArrayLike): kcal/mol, finite, shape=[M].
        path: output PNG (parent folders are created).
        labels: legend labels of samples and reference.
        bins: number of equal bins.
        margin: kcal/mol above the highest reference energy that the bins may reach.
        weights (ArrayLike): None, or ``>= 0`` per sample (0 for non-finite energies),
            shape=[N].

    Returns:
        ``path``.
    """
    E = np.asarray(E_samples, dtype=np.float64).ravel()
    Er = np.asarray(E_ref, dtype=np.float64).ravel()
    w = _sample_weights(weights, E.size)
    cap = energy_cap(Er, margin)
    shown = E[np.isfinite(E) & (E <= cap)]
    lo = min(Er.min(), shown.min()) if shown.size else Er.min()
    hi = max(Er.max(), shown.max()) if shown.size else Er.max()
    fig = Figure(figsize=(5.0, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    limits = (lo, hi + 1e-9)
    with np.errstate(invalid="ignore"):  # every sample above the cap: an empty 0/0 density
        draw_histograms(ax, {labels[0]: E, labels[1]: Er}, bins=bins, limits=limits,
                        xlabel="MMFF94 energy (kcal/mol)")  # fmt: skip
    above = int((E > cap).sum())  # +inf included; NaN is only in the legend's count
    title = f"{above} of {E.size} {labels[0]} above {cap:.0f} kcal/mol (not shown)" if above \
        else ""  # fmt: skip
    if w is not None:
        keep = np.isfinite(E) & (E <= cap) & (w > 0)
        if w[keep].sum() > 0:  # the same bins as draw_histograms'; density over what is shown
            ax.hist(E[keep], bins=np.linspace(*limits, bins + 1), weights=w[keep], density=True,
                    histtype="step", lw=1.5, ls="--", label=f"{labels[0]}, reweighted")  # fmt: skip
            ax.legend(fontsize=8)
        hidden = 1.0 - w[keep].sum() / w.sum()
        if above and hidden > 0.005:  # a density of a sliver of the weight would mislead
            title += f", {100 * hidden:.0f} % of the weight"
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def _sample_weights(weights, n: int) -> np.ndarray | None:
    """``weights`` as float64 ``(n,)`` (checked: finite, ``>= 0``, not all 0), or None."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64).ravel()
    if w.size != n:
        raise ValueError(f"weights has {w.size} values for {n} samples")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be finite, >= 0 and not all 0")
    return w


def plot_torsions(
    X_samples,
    X_ref,
    quads,
    path: str | os.PathLike,
    labels: tuple[str, str] = ("samples", "reference"),
    bins: int = 36,
    ncols: int = 4,
    weights=None,
) -> Path:
    """One small panel per torsion: histograms (degrees, -180..180) of samples and reference,
    titled with the atoms and the JSD of `grassflow.metrics.chemistry.torsion_jsd`.

    With ``weights`` (importance weights of the samples), the reweighted histogram of the
    samples is drawn too and the title adds its JSD to the reference (``rew.``: same bins,
    weighted counts).

    Args:
        X_samples (ArrayLike): shape=[N, n, 3].
        X_ref (ArrayLike): shape=[M, n, 3].
        quads (ArrayLike): shape=[T, 4], T >= 1.
        path: output PNG.
        labels: legend labels of samples and reference.
        bins: bins on (-180, 180].
        ncols: panels per row.
        weights (ArrayLike): None, or ``>= 0`` per sample, shape=[N].

    Returns:
        ``path``.
    """
    q = np.asarray(quads).reshape(-1, 4)
    if len(q) == 0:
        raise ValueError("no torsions to plot (quads is empty)")
    phi, phi_ref = np.degrees(dihedrals(X_samples, q)), np.degrees(dihedrals(X_ref, q))
    w = _sample_weights(weights, len(phi))
    jsds = torsion_jsd(X_samples, X_ref, q, bins)
    ncols = min(ncols, len(q))
    nrows = math.ceil(len(q) / ncols)
    fig = Figure(figsize=(2.6 * ncols, 2.1 * nrows), layout="constrained")
    edges = np.linspace(-180, 180, bins + 1)
    for t, quad in enumerate(q):
        ax = fig.add_subplot(nrows, ncols, t + 1)
        for v, label in ((phi[:, t], labels[0]), (phi_ref[:, t], labels[1])):
            ax.hist(v, bins=edges, density=True, histtype="step", lw=1.3, label=label)
        title = f"{'-'.join(map(str, quad))}  JSD {jsds[t]:.3f}"
        if w is not None:
            ax.hist(phi[:, t], bins=edges, weights=w, density=True, histtype="step", lw=1.3,
                    ls="--", label=f"{labels[0]}, reweighted")  # fmt: skip
            h = np.histogram(phi[:, t], bins=edges, weights=w)[0]
            title += f", rew. {jsd(h, np.histogram(phi_ref[:, t], bins=edges)[0]):.3f}"
        ax.set_xlim(-180, 180)
        ax.set_xticks([-180, -90, 0, 90, 180])
        ax.set_yticks([])
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        if t == 0:
            ax.legend(fontsize=7)
    return _save(fig, path)


def plot_ramachandran(
    phi_psi_samples,
    phi_psi_ref,
    path: str | os.PathLike,
    labels: tuple[str, str] = ("samples", "reference"),
    bins: int = 60,
) -> Path:
    """Ramachandran plots side by side: 2-D histograms (log colour scale) of (phi, psi).

    Get the angles with ``dihedrals(X, alanine_dipeptide_phi_psi(mol))`` from
    `grassflow.metrics.chemistry`.

    Args:
        phi_psi_samples (ArrayLike): radians, shape=[N, 2].
        phi_psi_ref (ArrayLike): radians, shape=[M, 2].
        path: output PNG.
        labels: panel titles.
        bins: bins per axis on -180..180 degrees.

    Returns:
        ``path``.
    """
    from matplotlib.colors import LogNorm

    fig = Figure(figsize=(8.4, 3.8), layout="constrained")
    for c, (a, label) in enumerate(((phi_psi_samples, labels[0]), (phi_psi_ref, labels[1]))):
        a = np.degrees(np.asarray(a, dtype=np.float64))
        if a.ndim != 2 or a.shape[1] != 2:
            raise ValueError(f"{label}: phi/psi must be (N, 2), got {a.shape}")
        ax = fig.add_subplot(1, 2, c + 1)
        *_, image = ax.hist2d(a[:, 0], a[:, 1], bins=bins, range=[[-180, 180], [-180, 180]],
                              norm=LogNorm(), cmap="viridis")  # fmt: skip
        fig.colorbar(image, ax=ax, label="count")
        ax.set(xlim=(-180, 180), ylim=(-180, 180), xlabel="phi (deg)", ylabel="psi (deg)",
               title=f"{label} ({len(a)})", aspect="equal")  # fmt: skip
        ax.set_xticks([-180, -90, 0, 90, 180])
        ax.set_yticks([-180, -90, 0, 90, 180])
    return _save(fig, path)
