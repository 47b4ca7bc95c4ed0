"""DW4 and LJ13 sample files: loaders and the benchmarks' train/val/test protocols.

Three file layouts (``source``) are understood; each loader returns float64 positions
``X: (N, n, d)`` centred per sample (the mean particle position is subtracted).

- ``"enf"``: the E(n)-NF / Köhler, Klein & Noé (2020) files, provided by the user.
  DW4: ``dw4-dataidx.npy``, a pickled 2-element object array ``(data, idx)``; ``idx`` is
  ignored. val = rows ``[-(n_val + n_test):-n_test]``, test = the last ``n_test`` rows,
  train = the first ``n_train`` rows (no shuffling).
  LJ13: train = ``holdout_data_LJ13[idx_LJ13[:n_train]]``, test = ``all_data_LJ13[:n_test]``,
  val = ``all_data_LJ13[n_test:n_test + n_val]``.
- ``"klein"``: Klein, Krämer & Noé (2023) splits (as shipped with DEM).
  DW4: train/val/test = the first ``n_train``/``n_val``/``n_test`` rows of
  ``{train,val,test}_split_DW4.npy``. LJ13 has no train file: train = the first ``n_train``
  rows of ``val_split_LJ13-1000.npy``, test = the first ``n_test`` rows of
  ``test_split_LJ13-1000.npy`` and val = its next ``n_val`` rows.
- ``"generated"``: one file ``<system>.npy`` written by ``grassflow data make``, split like
  E-NF DW4 (its rows are ordered so that the two ends are far apart in chain time).

With the defaults ``n_val = n_test = 1000`` these are the published protocols.
Plain ``.npy`` files are memory-mapped and only the rows used are copied. The pickled E-NF
DW4 file is unpickled (it may hold a torch tensor): load only files you trust.

References:
    Köhler, Klein, Noé. Equivariant Flows (ICML 2020).
    Garcia Satorras et al. E(n) Equivariant Normalizing Flows (NeurIPS 2021).
    Klein, Krämer, Noé. Equivariant flow matching (NeurIPS 2023).
"""

from __future__ import annotations

import os
from numbers import Integral
from pathlib import Path

import numpy as np

__all__ = ["SOURCES", "SOURCE_FILES", "load_splits", "missing_files", "shared_data_dir"]

SOURCES: tuple[str, ...] = ("enf", "klein", "generated")

# (particles n, spatial dimension d); kept here so this module stands alone
_SHAPES: dict[str, tuple[int, int]] = {"dw4": (4, 2), "lj13": (13, 3)}

SOURCE_FILES: dict[tuple[str, str], tuple[str, ...]] = {
    ("enf", "dw4"): ("dw4-dataidx.npy",),
    ("enf", "lj13"): ("holdout_data_LJ13.npy", "idx_LJ13.npy", "all_data_LJ13.npy"),
    ("klein", "dw4"): ("train_split_DW4.npy", "val_split_DW4.npy", "test_split_DW4.npy"),
    ("klein", "lj13"): ("val_split_LJ13-1000.npy", "test_split_LJ13-1000.npy"),
    ("generated", "dw4"): ("dw4.npy",),
    ("generated", "lj13"): ("lj13.npy",),
}


def shared_data_dir() -> Path | None:
    """The project's shared data folder, or ``None`` when there is none.

    Looks, in order, at ``$GRASSFLOW_SHARED_DATA``, ``../shared/data`` from the current
    directory and ``../shared/data`` from the repository root; returns the first that exists.
    """
    candidates = []
    if os.environ.get("GRASSFLOW_SHARED_DATA"):
        candidates.append(Path(os.environ["GRASSFLOW_SHARED_DATA"]))
    candidates.append(Path.cwd() / ".." / "shared" / "data")
    # src/grassflow/data/this_file -> parents[3] is the repository root (editable install)
    candidates.append(Path(__file__).resolve().parents[3] / ".." / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    return None


# ------------------------------------------------------------------ validation
def _check_names(system: str, source: str) -> None:
    if system not in _SHAPES:
        raise ValueError(f"unknown system {system!r}; choices are {', '.join(_SHAPES)}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choices are {', '.join(SOURCES)}")


def _check_count(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _need(path: Path, n_rows: int, **parts: int) -> None:
    """Raise unless the file at ``path`` has at least ``sum(parts)`` rows."""
    total = sum(parts.values())
    if n_rows < total:
        terms = " + ".join(f"{k}={v}" for k, v in parts.items())
        raise ValueError(
            f"file {path} has {n_rows} rows; the protocol needs {terms}"
            + (f" = {total}" if len(parts) > 1 else "")
        )


def _rows(a: np.ndarray, path: Path, system: str, allow_flat: bool = False) -> np.ndarray:
    """View ``a`` as ``(N, n*d)`` rows, accepting ``(N, n*d)`` or ``(N, n, d)``."""
    n, d = _SHAPES[system]
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"file {path}: expected real numbers, got dtype {a.dtype}")
    # E-NF reshapes its DW4 data with .reshape(-1, 8), so a flat array is accepted there
    flat_ok = allow_flat and a.ndim == 1 and a.size % (n * d) == 0
    if not (flat_ok or a.shape[1:] in ((n * d,), (n, d))):
        raise ValueError(
            f"file {path}: expected rows of {n * d} numbers ({system}: {n} particles in "
            f"{d}-D), i.e. shape (N, {n * d}) or (N, {n}, {d}); got shape {a.shape}"
        )
    return a.reshape(-1, n * d)


def _take(rows: np.ndarray, index: slice | np.ndarray, path: Path, system: str) -> np.ndarray:
    """Copy ``rows[index]`` to centred float64 ``(m, n, d)``; raise on NaN or inf."""
    n, d = _SHAPES[system]
    X = np.array(rows[index], dtype=np.float64).reshape(-1, n, d)
    bad = int(np.count_nonzero(~np.isfinite(X)))
    if bad:
        raise ValueError(f"file {path}: {bad} NaN or inf value(s) in the rows used")
    return X - X.mean(axis=1, keepdims=True)


def _open(path: Path, system: str) -> np.ndarray:
    return _rows(np.load(path, mmap_mode="r"), path, system)


# ------------------------------------------------------------------ layouts
def _tail_split(
    rows: np.ndarray, path: Path, system: str, n_train: int, n_val: int, n_test: int
) -> dict[str, np.ndarray]:
    """E-NF DW4 / generated: held-out sets at the end, train from the start."""
    N = len(rows)
    _need(path, N, n_train=n_train, n_val=n_val, n_test=n_test)
    # positive indices, so that n_test = 0 does not turn [-0:] into "all rows"
    return {
        "train": _take(rows, slice(0, n_train), path, system),
        "val": _take(rows, slice(N - n_test - n_val, N - n_test), path, system),
        "test": _take(rows, slice(N - n_test, N), path, system),
    }


def _load_enf_dw4(folder: Path, n_train: int, n_val: int, n_test: int):
    path = folder / "dw4-dataidx.npy"
    obj = np.load(path, allow_pickle=True)
    if not (isinstance(obj, np.ndarray) and obj.dtype == object and obj.shape == (2,)):
        raise ValueError(
            f"file {path}: expected a pickled 2-element object array (data, idx), got "
            f"{type(obj).__name__} of shape {getattr(obj, 'shape', None)}"
        )
    data = obj[0]
    if hasattr(data, "detach"):  # E-NF saved torch tensors
        data = data.detach().cpu().numpy()
    rows = _rows(np.asarray(data), path, "dw4", allow_flat=True)
    return _tail_split(rows, path, "dw4", n_train, n_val, n_test)


def _load_enf_lj13(folder: Path, n_train: int, n_val: int, n_test: int):
    holdout_path, idx_path, all_path = (folder / f for f in SOURCE_FILES[("enf", "lj13")])
    holdout, all_data = _open(holdout_path, "lj13"), _open(all_path, "lj13")
    idx = np.load(idx_path, mmap_mode="r")
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(
            f"file {idx_path}: expected a 1-D integer index array, got {idx.dtype} {idx.shape}"
        )
    _need(idx_path, len(idx), n_train=n_train)
    train_idx = np.array(idx[:n_train])
    if train_idx.min() < 0 or train_idx.max() >= len(holdout):
        raise ValueError(
            f"file {idx_path}: indices must lie in [0, {len(holdout)}) ({holdout_path.name} "
            f"has {len(holdout)} rows), got [{train_idx.min()}, {train_idx.max()}]"
        )
    _need(all_path, len(all_data), n_test=n_test, n_val=n_val)
    return {
        "train": _take(holdout, train_idx, holdout_path, "lj13"),
        "val": _take(all_data, slice(n_test, n_test + n_val), all_path, "lj13"),
        "test": _take(all_data, slice(0, n_test), all_path, "lj13"),
    }


def _load_klein_dw4(folder: Path, n_train: int, n_val: int, n_test: int):
    out = {}
    for split, size in (("train", n_train), ("val", n_val), ("test", n_test)):
        path = folder / f"{split}_split_DW4.npy"
        rows = _open(path, "dw4")
        _need(path, len(rows), **{f"n_{split}": size})
        out[split] = _take(rows, slice(0, size), path, "dw4")
    return out


def _load_klein_lj13(folder: Path, n_train: int, n_val: int, n_test: int):
    train_path, test_path = (folder / f for f in SOURCE_FILES[("klein", "lj13")])
    train_rows, test_rows = _open(train_path, "lj13"), _open(test_path, "lj13")
    _need(train_path, len(train_rows), n_train=n_train)
    _need(test_path, len(test_rows), n_test=n_test, n_val=n_val)
    return {
        "train": _take(train_rows, slice(0, n_train), train_path, "lj13"),
        "val": _take(test_rows, slice(n_test, n_test + n_val), test_path, "lj13"),
        "test": _take(test_rows, slice(0, n_test), test_path, "lj13"),
    }


def _load_generated(system: str):
    def load(folder: Path, n_train: int, n_val: int, n_test: int):
        path = folder / f"{system}.npy"
        return _tail_split(_open(path, system), path, system, n_train, n_val, n_test)

    return load


_LOADERS = {
    ("enf", "dw4"): _load_enf_dw4,
    ("enf", "lj13"): _load_enf_lj13,
    ("klein", "dw4"): _load_klein_dw4,
    ("klein", "lj13"): _load_klein_lj13,
    ("generated", "dw4"): _load_generated("dw4"),
    ("generated", "lj13"): _load_generated("lj13"),
}


# ------------------------------------------------------------------ public API
def missing_files(system: str, source: str, data_dir: str | os.PathLike) -> list[str]:
    """Names of the files of ``(source, system)`` that ``data_dir`` lacks (empty if none)."""
    _check_names(system, source)
    folder = Path(data_dir)
    return [name for name in SOURCE_FILES[(source, system)] if not (folder / name).is_file()]


def load_splits(
    system: str,
    source: str,
    data_dir: str | os.PathLike,
    n_train: int,
    n_val: int = 1000,
    n_test: int = 1000,
) -> dict[str, np.ndarray]:
    """Load the train/val/test sets of ``system`` from files in the ``source`` layout.

    Args:
        system: ``"dw4"`` (4 particles in 2-D) or ``"lj13"`` (13 particles in 3-D).
        source: one of `SOURCES` (module docs give each layout's protocol).
        data_dir: folder holding the files `SOURCE_FILES` names for
            ``(source, system)``.
        n_train: training set size (>= 1).
        n_val: validation set size (>= 0); the published protocols use 1000.
        n_test: test set size (as n_val).

    Returns:
        ``{"train": (n_train, n, d), "val": (n_val, n, d), "test": (n_test, n, d)}``,
        float64 and centred (``X.mean(axis=1) == 0``).

    Raises:
        FileNotFoundError: a file of the layout is missing from ``data_dir``.
        ValueError: unknown system or source, bad sizes, a file of the wrong shape, NaN or
            inf in the rows used, or fewer rows than the protocol needs.
    """
    _check_names(system, source)
    n_train = _check_count(n_train, "n_train", 1)
    n_val, n_test = _check_count(n_val, "n_val", 0), _check_count(n_test, "n_test", 0)
    folder = Path(data_dir)
    missing = missing_files(system, source, folder)
    if missing:
        raise FileNotFoundError(
            f"{source!r} {system} data needs {', '.join(SOURCE_FILES[(source, system)])} in "
            f"{folder}; missing: {', '.join(missing)}"
        )
    return _LOADERS[(source, system)](folder, n_train, n_val, n_test)
