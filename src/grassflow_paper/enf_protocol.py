"""The vs-E-NF protocol that the two-part model's runs (`vs_enf`) and the EFM baseline's
(`efm`) share: the Klein et al. files in ``../shared/data/alt_klein2023_from_DEM/``, their
split (`ENF_SPLITS`) and the one-line summary of a run's evaluation. Both modules import this one,
and `vs_enf` imports `efm` (its `sweep` runs either model), never the other way round.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from grassflow.data.overlap import distinct_rows
from grassflow.data.particle_files import missing_files, shared_data_dir

from .two_part import nll_summary

__all__ = ["ENF_SPLITS", "KLEIN_DIR", "SHAPES", "data_dir_of", "eval_summary", "load_enf_splits"]

SHAPES = {"dw4": (4, 2), "lj13": (13, 3)}  # (points n, dimension d)
KLEIN_DIR = "alt_klein2023_from_DEM"

# Issue 14's protocol: split -> (file, first row, end row); None = n_train. LJ13 selects on
# rows 1,000-2,000 of its test file, never on the first 1,000 (its test set).
ENF_SPLITS = {
    "dw4": {"train": ("train_split_DW4.npy", 0, None), "val": ("val_split_DW4.npy", 0, 1000),
            "test": ("test_split_DW4.npy", 0, 1000)},
    "lj13": {"train": ("val_split_LJ13-1000.npy", 0, None),
             "val": ("test_split_LJ13-1000.npy", 1000, 2000),
             "test": ("test_split_LJ13-1000.npy", 0, 1000)},
}  # fmt: skip


def data_dir_of(data_dir: str | Path | None) -> Path:
    """The folder of the Klein files: ``data_dir``, or the shared one by default."""
    shared = shared_data_dir() if data_dir is None else None
    if data_dir is None and shared is None:
        raise FileNotFoundError("no ../shared/data folder (or $GRASSFLOW_SHARED_DATA): pass "
                                f"data_dir, the folder of the Klein files ({KLEIN_DIR})")
    return Path(data_dir) if data_dir is not None else shared / KLEIN_DIR


def load_enf_splits(
    system: str, n_train: int, data_dir: str | Path | None = None, dedup: bool = True
) -> dict:
    """``{"train", "val", "test"}``: clouds ``(N, n, d)`` float64 as `ENF_SPLITS` takes
    them from the files in ``data_dir`` (default ``../shared/data/alt_klein2023_from_DEM``).

    ``dedup``: the training clouds are the distinct rows of the first ``n_train`` (first
    occurrences, in order). DW4's training file repeats rows (30,091 distinct in 100,000), so
    ``len(out["train"])`` can be far below ``n_train``. Validation and test rows are kept as
    the anchors use them; see `vs_enf.evaluate` for the test rows seen in training."""
    if system not in ENF_SPLITS:
        raise ValueError(f"system must be one of {tuple(ENF_SPLITS)}, got {system!r}")
    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise ValueError(f"n_train must be a positive integer, got {n_train!r}")
    folder = data_dir_of(data_dir)
    if missing := missing_files(system, "klein", folder):
        raise FileNotFoundError(f"{system} needs {', '.join(missing)} in {folder}")
    out = {}
    for split, (name, start, end) in ENF_SPLITS[system].items():
        rows, end = np.load(folder / name, mmap_mode="r"), n_train if end is None else end
        if len(rows) < end:
            raise ValueError(f"{folder / name} has {len(rows)} rows; {split} needs {end}")
        X = np.asarray(rows[start:end])
        if split == "train" and dedup:
            X = X[distinct_rows(X)]
        out[split] = torch.tensor(X, dtype=torch.float64).reshape(-1, *SHAPES[system])
    return out


def eval_summary(r: dict) -> str:
    """One line on the evaluation ``r`` of a vs-E-NF run, the two-part model's (with its parts)
    or the baseline's (`efm`)."""
    return (f"[{r['system']}, {r['model']}, n_train {r['n_train']}, atol = rtol = {r['atol']:g}] "
            f"Cartesian test NLL {nll_summary(r)}")  # fmt: skip
