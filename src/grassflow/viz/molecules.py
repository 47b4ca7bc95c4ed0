"""The paper's Figure 5 for QM9: generated molecules beside their nearest training molecules.

The alignment is `grassflow.manifolds.alignment.superpose`; the nearest-neighbour search is
`grassflow.metrics.nearest`.

References:
    Yataka, Hirashima, Shiraishi. Grassmann Manifold Flows for Stable Shape Generation
    (NeurIPS 2023), §5.3 and Figure 5.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from ..manifolds.alignment import superpose
from ..metrics.nearest import as_molecule_batch, nearest

__all__ = ["plot_nearest", "plot_side_by_side"]

_DPI = 110
_CELL = 2.6  # inches per 3-D panel
# CPK-like colours by atomic number (H, C, N, O, F); anything else is grey
_ELEMENT_COLOURS = {1: "0.85", 6: "0.25", 7: "tab:blue", 8: "tab:red", 9: "tab:green"}


def _colours(charges, default: str):
    """Per-atom colours by atomic number, or ``default`` for all without ``charges``."""
    if charges is None:
        return default
    return [_ELEMENT_COLOURS.get(int(z), "tab:purple") for z in np.asarray(charges)]


def _draw(ax, P: np.ndarray, colours, cutoff: float, lim: float, elev, azim, title,
          clash: float | None = None) -> None:  # fmt: skip
    i, j = np.triu_indices(len(P), 1)
    r = np.linalg.norm(P[i] - P[j], axis=1)
    bond = r < cutoff
    segs = np.stack([P[i[bond]], P[j[bond]]], 1)
    ax.add_collection3d(Line3DCollection(segs, colors="0.4", linewidths=1.2))
    if clash is not None and (r < clash).any():  # atoms closer than any bond: in red
        close = r < clash
        segs = np.stack([P[i[close]], P[j[close]]], 1)
        ax.add_collection3d(Line3DCollection(segs, colors="red", linewidths=3.0))
    ax.scatter(*P.T, c=colours, s=40, edgecolors="k", linewidths=0.4, depthshade=False)
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), zlim=(-lim, lim))
    ax.set_box_aspect((1, 1, 1), zoom=1.3)
    ax.view_init(elev=elev, azim=azim)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)


def plot_nearest(
    X,
    T,
    path: str | os.PathLike,
    n: int = 4,
    *,
    charges=None,
    idx=None,
    sample_charges=None,
    bond_cutoff: float = 1.7,
    elev: float = 20.0,
    azim: float = -60.0,
    **nearest_kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Figure 5: ``n`` rows, each a generated molecule beside its aligned nearest training one.

    The first ``n`` molecules of ``X`` are drawn. Bonds are inferred from distance alone
    (atoms closer than ``bond_cutoff``); generated atoms are drawn in one colour (by element
    if ``sample_charges`` is given: a model conditioned on atom types), training atoms by
    element if ``charges`` is given. Both panels of a row share the view and the axis limits,
    and the training molecule is superposed onto the generated one with `superpose`.

    Args:
        X (ArrayLike): generated molecules, shape=[M, n_atoms, 3] (Å), ``M >= n``.
        T (ArrayLike): training molecules, shape=[N, n_atoms, 3] (Å).
        path: output PNG (saved at 110 dpi).
        n: rows.
        charges (ArrayLike | None): optional atomic numbers of ``T``, shape=[N, n_atoms]
            (H=1, C=6, ...).
        idx (ArrayLike | None): optional precomputed nearest rows of ``T``, shape=[n] or
            [M, k] (first column used); computed with `nearest` if omitted.
        sample_charges (ArrayLike | None): optional atomic numbers of ``X``,
            shape=[M, n_atoms].
        bond_cutoff: bond length threshold (Å).
        elev: camera elevation in degrees.
        azim: camera azimuth in degrees.
        **nearest_kwargs: passed to `nearest` (and on to `superpose`).

    Returns:
        ``idx``: int64 shape=[n], the training rows drawn; ``rmsd``: float64 shape=[n] (Å).
    """
    X, T = as_molecule_batch(X, "X"), as_molecule_batch(T, "T")
    if not 1 <= n <= len(X):
        raise ValueError(f"need 1 <= n <= len(X) = {len(X)}, got n={n}")
    if charges is not None and np.shape(charges) != T.shape[:2]:
        raise ValueError(f"charges must have shape {T.shape[:2]}, got {np.shape(charges)}")
    X = X[:n]
    if idx is None:
        idx = nearest(X, T, **nearest_kwargs)[0][:, 0]
    idx = np.asarray(idx, dtype=np.int64).reshape(len(idx), -1)[:n, 0]
    if len(idx) != n:
        raise ValueError(f"idx must hold at least n = {n} rows, got shape {idx.shape}")
    skip = ("k", "candidates", "refine")
    align_kwargs = {key: v for key, v in nearest_kwargs.items() if key not in skip}
    fig = Figure(figsize=(2 * _CELL, n * _CELL))
    fig.subplots_adjust(left=0, right=1, bottom=0, top=0.97, wspace=0, hspace=0.08)
    rmsds = np.empty(n)
    for r, (x, j) in enumerate(zip(X, idx)):
        x = x - x.mean(0)
        t, perm, rmsds[r] = superpose(x, T[j], **align_kwargs)
        tc = _colours(None if charges is None else np.asarray(charges[j])[perm], "tab:orange")
        xc = _colours(None if sample_charges is None else sample_charges[r], "tab:cyan")
        lim = 1.05 * max(np.abs(x).max(), np.abs(t).max())
        ax = fig.add_subplot(n, 2, 2 * r + 1, projection="3d")
        _draw(ax, x, xc, bond_cutoff, lim, elev, azim, f"generated #{r}")
        ax = fig.add_subplot(n, 2, 2 * r + 2, projection="3d")
        title = f"train #{j}, RMSD {rmsds[r]:.2f} Å"
        _draw(ax, t, tc, bond_cutoff, lim, elev, azim, title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return idx, rmsds


def plot_side_by_side(
    samples: dict[str, np.ndarray],
    path: str | os.PathLike,
    n: int = 4,
    *,
    charges: dict[str, np.ndarray] | None = None,
    bond_cutoff: float = 1.7,
    clash: float = 0.9,
    elev: float = 20.0,
    azim: float = -60.0,
) -> dict[str, float]:
    """Generated molecules of several models, one column each (Figure 5 side by side).

    Each column draws the first ``n`` molecules of its model, with bonds inferred from
    distance (``< bond_cutoff``) and clashes (atoms closer than ``clash``, which no QM9
    molecule has) in red; its title gives the fraction of all its samples with a clash.

    Args:
        samples: model name -> generated molecules, shape=[M, n_atoms, 3] (Å), ``M >= n``.
        path: output PNG (saved at 110 dpi).
        n: rows.
        charges: model name -> atomic numbers of its molecules, shape=[M, n_atoms], for the
            models conditioned on atom types (their atoms drawn by element).

    Returns:
        Model name -> clash fraction over all its samples.
    """
    batches = {name: as_molecule_batch(X, name) for name, X in samples.items()}
    if not batches or min(len(X) for X in batches.values()) < n:
        raise ValueError(f"every model needs at least n = {n} samples")
    fig = Figure(figsize=(len(batches) * _CELL, n * _CELL))
    fig.subplots_adjust(left=0, right=1, bottom=0, top=0.95, wspace=0, hspace=0.08)
    fractions = {}
    for c, (name, X) in enumerate(batches.items()):
        i, j = np.triu_indices(X.shape[1], 1)
        fractions[name] = float((np.linalg.norm(X[:, i] - X[:, j], axis=-1).min(-1)
                                 < clash).mean())  # fmt: skip
        for r in range(n):
            x = X[r] - X[r].mean(0)
            ax = fig.add_subplot(n, len(batches), r * len(batches) + c + 1, projection="3d")
            title = f"{name}: {fractions[name]:.0%} clash" if r == 0 else ""
            z = (charges or {}).get(name)
            _draw(ax, x, _colours(None if z is None else z[r], "tab:cyan"), bond_cutoff,
                  1.05 * np.abs(x).max(), elev, azim, title, clash=clash)  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return fractions
