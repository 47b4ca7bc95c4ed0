"""Does ``grassflow data make`` sample the right distribution? A check against reference data.

Compares our MCMC samples with independent samples of the same potential (the Klein et al.
2023 test splits, see ``shared/data/README.md``): histograms of the energy and of all pair
distances, with the two-sample Kolmogorov-Smirnov statistic and the histogram JSD, and the
same numbers for two halves of the reference (the noise floor at that sample size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from scipy.stats import ks_2samp

from ..io import write_json
from ..metrics import histogram, jsd
from .particle_files import SOURCE_FILES, shared_data_dir
from .particles import get_system

__all__ = ["REFERENCE_FILES", "compare", "markdown_table"]

REFERENCE_FILES = {"dw4": "test_split_DW4.npy", "lj13": "test_split_LJ13-1000.npy"}
MAX_ROWS = 10_000
BINS = 100


def _observables(system: str, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Energies ``(N,)`` and all pair distances ``(N * n(n-1)/2,)`` of flat configurations."""
    sysm = get_system(system)
    x = torch.as_tensor(np.asarray(rows, dtype=np.float64)).reshape(-1, sysm.n_particles, sysm.dim)
    with torch.no_grad():
        energy = sysm.energy(x).numpy()
    i, j = np.triu_indices(sysm.n_particles, 1)
    dist = (x[:, i] - x[:, j]).norm(dim=-1).numpy().ravel()
    return {"energy": energy, "pair_distance": dist}


def _stats(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    lo, hi = np.quantile(np.concatenate([a, b]), [0.001, 0.999])
    return {
        "ks": float(ks_2samp(a, b).statistic),
        "jsd": jsd(histogram(a, BINS, lo, hi), histogram(b, BINS, lo, hi)),
        "mean": float(a.mean()),
        "mean_reference": float(b.mean()),
    }


def compare(
    data_dir: str | Path = "data",
    reference_dir: str | Path | None = None,
    out_dir: str | Path = "results/data",
    systems: tuple[str, ...] = ("dw4", "lj13"),
) -> dict:
    """Write ``sampler_check.{json,md,png}`` comparing ``data_dir``'s files with the reference.

    Up to 10,000 rows of each are used. The noise floor compares the reference's two halves
    (5,000 rows each), so its KS is about sqrt(2) times the 10k-vs-10k floor.
    """
    if reference_dir is None:
        shared = shared_data_dir()
        if shared is None:
            raise FileNotFoundError(
                "no reference data: pass --reference DIR (Klein et al. layout) or set "
                "GRASSFLOW_SHARED_DATA"
            )
        reference_dir = shared / "alt_klein2023_from_DEM"
    result = {}
    samples = {}
    for system in systems:
        ours_path = Path(data_dir) / SOURCE_FILES["generated", system][0]
        ref_path = Path(reference_dir) / REFERENCE_FILES[system]
        for path in (ours_path, ref_path):
            if not path.exists():
                raise FileNotFoundError(f"{path} not found")
        ours = _observables(system, np.load(ours_path, mmap_mode="r")[:MAX_ROWS])
        ref_rows = np.load(ref_path, mmap_mode="r")[:MAX_ROWS]
        ref = _observables(system, ref_rows)
        half = len(ref_rows) // 2
        ref_a, ref_b = _observables(system, ref_rows[:half]), _observables(system, ref_rows[half:])
        result[system] = {
            name: {**_stats(ours[name], ref[name]),
                   "floor": _stats(ref_a[name], ref_b[name])}
            for name in ours
        }  # fmt: skip
        samples[system] = (ours, ref)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(result, out / "sampler_check.json")
    (out / "sampler_check.md").write_text(markdown_table(result))
    _plot(samples, out / "sampler_check.png")
    return result


def markdown_table(result: dict) -> str:
    lines = [
        "| system | observable | mean (ours) | mean (ref.) | KS | JSD | KS floor | JSD floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, obs in result.items():
        for name, s in obs.items():
            f = s["floor"]
            lines.append(
                f"| {system.upper()} | {name.replace('_', ' ')} | {s['mean']:.3f} | "
                f"{s['mean_reference']:.3f} | {s['ks']:.4f} | {s['jsd']:.5f} | {f['ks']:.4f} | "
                f"{f['jsd']:.5f} |"
            )
    return "\n".join(lines) + "\n"


def _plot(samples: dict, path: Path) -> None:
    fig = Figure(figsize=(7, 2.8 * len(samples)))
    axes = fig.subplots(len(samples), 2, squeeze=False)
    for row, (system, (ours, ref)) in zip(axes, samples.items()):
        for ax, name in zip(row, ("energy", "pair_distance")):
            lo, hi = np.quantile(np.concatenate([ours[name], ref[name]]), [0.001, 0.999])
            kw = dict(bins=BINS, range=(lo, hi), density=True, histtype="step")
            ax.hist(ref[name], label="reference (Klein et al.)", color="k", **kw)
            ax.hist(ours[name], label="grassflow data make", color="C3", **kw)
            ax.set_title(f"{system.upper()}: {name.replace('_', ' ')}", fontsize=10)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
