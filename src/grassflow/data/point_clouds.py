"""Reading users' own point clouds (``.npy``, ``.npz``, ``.xyz``, ``.sdf``) for a shape model,
and writing them as ``.xyz``.

This module reads and writes files; what the clouds carry (`PointClouds`, element symbols,
bond tables and their checks) is defined in `grassflow.data.cloud_chemistry`, and SDF files
are read by `grassflow.data.molecule_files.read_sdf`. It imports both; neither imports it.

A shape model is a density on centred clouds of ``n`` points in ``d`` dimensions; internally a
cloud is a point of the com-free Grassmann Gr(d, n - 1), so every cloud needs ``n >= d + 2``
points and full rank ``d`` after centring. `load_point_clouds` reads the clouds, checks
them (one shape, numeric, finite, enough points) and skips, with a note and one warning, the
rank-deficient ones (collinear points in 3-D, say). Positions are returned as read, not centred.

Per-point labels (atom types, as atomic numbers) come from the element symbols of ``.xyz``
frames, from a ``labels`` (or ``atomic_numbers``) array in an ``.npz``, from the atoms of an
``.sdf``, or, for ``shapes.npy``, from ``shapes_Z.npy`` beside it; either ``(n,)`` (shared by
all clouds) or ``(N, n)`` (per cloud).

Molecules keep their bonds: an ``.sdf`` (every record a conformer of one molecule) or an
``.npz`` with ``bonds`` fills the chemistry fields of `PointClouds` (``bonds``,
``bond_orders``, ``molblock``, ``smiles``), checked by
`grassflow.data.cloud_chemistry.npz_chemistry` and `grassflow.data.cloud_chemistry.bond_table`.

xyz frames are the standard ``count`` line, comment line, then ``count`` lines
``Symbol x y z [extra columns]``; the symbol may be an element (``C``, ``cl``), an atomic
number (``6``, or any integer label, ``-1``) or ``X`` (a dummy, label 0). Frames are numbered
from 0 in ``sources``. `write_xyz` writes labels 1 to 118 as element symbols, 0 as ``X`` and
any other integer as itself, so every integer label reads back as written.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from ..manifolds.shape_space import full_rank
from .cloud_chemistry import ELEMENTS, PointClouds, element_symbol, npz_chemistry
from .molecule_files import SDF_SUFFIXES, read_sdf

__all__ = [
    # defined in grassflow.data.cloud_chemistry; importable from here as before
    "ELEMENTS",
    "PointClouds",
    "element_symbol",
    # this module's own
    "load_point_clouds",
    "save_clouds",
    "write_xyz",
]


def load_point_clouds(
    path: str | os.PathLike, *, key: str | None = None, rtol: float = 1e-6
) -> PointClouds:
    """Read point clouds from a ``.npy``/``.npz``/``.xyz``/``.sdf`` file or a folder of ``.xyz``
    files.

    Args:
        path: a ``.npy`` array ``(N, n, d)``, with optional labels in ``<stem>_Z.npy``
            beside it (``shapes.npy`` -> ``shapes_Z.npy``); a ``.npz`` with the array under
            ``key``, or its only array, or under ``"positions"``, optional labels under
            ``"labels"`` and/or ``"atomic_numbers"`` (the same thing; they must agree), and
            optionally a molecule's ``"bonds"`` ``(B, 2)`` or ``(B, 3)`` (order third),
            ``"bond_orders"`` ``(B,)``, ``"smiles"`` and ``"molblock"`` (0-d strings); a
            multi-frame ``.xyz`` file; an ``.sdf`` (``.sd``, ``.mol``) whose records are
            conformers of one molecule (needs RDKit, see
            `grassflow.data.molecule_files.read_sdf`); or a folder whose ``.xyz`` files are
            read in name order. Labels are integers (atomic numbers for chemistry),
            ``(N, n)`` per cloud or ``(n,)`` shared by all clouds.
        key: the ``.npz`` entry holding the positions.
        rtol: a cloud whose smallest singular value after centring is ``<= rtol`` times its
            largest is rank deficient: it is skipped, noted in ``skipped`` and warned about.

    Returns:
        `PointClouds` with the ``N`` kept clouds.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: unknown extension, no clouds, ragged or non-3-D shapes, non-numeric or
            non-finite values, fewer than ``d + 2`` points, every cloud rank deficient,
            labels that are not integers or do not fit the clouds' shape, labels and
            atomic numbers that disagree, a bad bond table (see
            `grassflow.data.cloud_chemistry.bond_table`), bonds without labels, or an SDF
            that is not conformers of one molecule with 3-D coordinates.
        ImportError: an ``.sdf`` without RDKit installed.
    """
    path = Path(path)
    if not (np.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"rtol must be a finite number >= 0, got {rtol!r}")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    labels, labels_from, chem = None, None, {}
    suffix = path.suffix.lower()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".xyz")
        if not files:
            raise ValueError(f"{path}: folder holds no .xyz files")
        P, labels, sources = _read_xyz_files(path, files, f"{path.resolve().name}/")
        labels_from = "xyz element symbols"
    elif suffix == ".xyz":
        P, labels, sources = _read_xyz_files(path, [path], "")
        labels_from = "xyz element symbols"
    elif suffix == ".npy":
        P = _load_npy(path)
        sources = [f"{path.name}[{i}]" for i in range(len(P))] if P.ndim else []
        z_path = labels_path(path)
        if z_path.is_file():  # the labels beside it
            labels, labels_from = _load_npy(z_path), z_path.name
    elif suffix == ".npz":
        P, labels, name, chem = _load_npz(path, key)
        sources = [f"{path.name}:{name}[{i}]" for i in range(len(P))] if P.ndim else []
        labels_from = None if labels is None else f"{path.name}:labels"
    elif suffix in SDF_SUFFIXES:
        pc = read_sdf(path)  # imports RDKit, only for molecules
        P, labels, sources, labels_from = pc.positions, pc.labels, pc.sources, pc.labels_from
        chem = {k: getattr(pc, k) for k in ("bonds", "bond_orders", "molblock", "smiles")}
    else:
        raise ValueError(
            f"{path}: unknown extension {path.suffix!r}; expected .npy, .npz, "
            ".xyz, .sdf or a folder of .xyz files"
        )
    P = _check_positions(path, P, sources)
    if labels is not None:
        where = f"{labels_path(path)} (the labels of {path.name})" if labels_from and (
            labels_from.endswith("_Z.npy")) else str(path)  # fmt: skip
        labels = _check_labels(where, labels, P.shape[:2])
    if suffix == ".npz" and chem:
        labels, labels_from, chem = _npz_molecule(path, chem, labels, labels_from, P.shape[:2])
    pc = PointClouds(P, labels, sources, [], labels_from, **chem)
    return _drop_rank_deficient(path, pc, rtol)


def _npz_molecule(
    path: Path, chem: dict, labels: np.ndarray | None, labels_from: str | None, shape: tuple
) -> tuple[np.ndarray | None, str | None, dict]:
    """Labels merged with ``atomic_numbers``, and the chemistry fields of an ``.npz``."""
    if "atomic_numbers" in chem:
        Z = _check_labels(f"{path} (atomic_numbers)", chem.pop("atomic_numbers"), shape)
        if labels is not None and not np.array_equal(labels, Z):
            i, k = np.argwhere(labels != Z)[0]
            raise ValueError(
                f"{path}: labels and atomic_numbers disagree (cloud {i}, point {k}: "
                f"{labels[i, k]} vs {Z[i, k]}); they name the same thing, keep one"
            )
        labels, labels_from = Z, labels_from or f"{path.name}:atomic_numbers"
    return labels, labels_from, npz_chemistry(str(path), chem, labels, shape[1])


def labels_path(path: str | os.PathLike) -> Path:
    """Where `load_point_clouds` looks for the labels of a ``.npy``: ``shapes.npy`` ->
    ``shapes_Z.npy`` beside it."""
    path = Path(path)
    return path.with_name(f"{path.stem}_Z.npy")


def write_xyz(
    path: str | os.PathLike,
    positions: np.ndarray,
    labels: np.ndarray | None = None,
    comment: str = "grassflow sample",
) -> None:
    """Write clouds as a multi-frame ``.xyz`` file (one frame per cloud).

    Args:
        path: the file to write (parent folders are made).
        positions: ``(N, n, 3)`` or one cloud ``(n, 3)``.
        labels: ``(N, n)`` or ``(n,)`` integer labels, taken as atomic numbers: 1 to 118 are
            written as element symbols, 0 as ``X``, any other integer as itself (see
            `element_symbol`; each reads back as written); ``None`` writes ``X`` throughout.
        comment: the comment line of every frame (one line).
    """
    P = np.asarray(positions, dtype=np.float64)
    P = P[None] if P.ndim == 2 else P
    if P.ndim != 3 or P.shape[-1] != 3:
        raise ValueError(
            f"write_xyz {path}: positions must be (N, n, 3) or (n, 3), got "
            f"{np.shape(positions)} (xyz holds 3-D points; save .npy otherwise)"
        )
    if not np.isfinite(P).all():
        raise ValueError(f"write_xyz {path}: positions contain NaN or inf")
    if "\n" in comment or "\r" in comment:
        raise ValueError(f"write_xyz {path}: comment must be one line, got {comment!r}")
    N, n, _ = P.shape
    if labels is None:
        symbols = np.full((N, n), "X", dtype=object)
    else:
        L = np.asarray(labels)
        try:
            L = np.broadcast_to(L, (N, n))
        except ValueError:
            raise ValueError(
                f"write_xyz {path}: labels of shape {L.shape} do not fit "
                f"positions {P.shape}; expected ({N}, {n}) or ({n},)"
            ) from None
        symbols = np.vectorize(element_symbol, otypes=[object])(L)
    lines = []
    for P_i, s_i in zip(P, symbols):
        lines += [str(n), comment]
        lines += [f"{s:<2} {x:.10f} {y:.10f} {z:.10f}" for s, (x, y, z) in zip(s_i, P_i)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as e:  # object (e.g. ragged) arrays need pickle
        raise ValueError(
            f"{path}: cannot read a numeric array ({e}); is it ragged or of non-numeric dtype?"
        ) from None


# .npz entries that are not positions: labels and a molecule's graph (`save_ensemble` too)
_NPZ_CHEMISTRY = ("atomic_numbers", "bonds", "bond_orders", "smiles", "molblock")
_NPZ_NOT_POSITIONS = ("labels", "stats", *_NPZ_CHEMISTRY)


def _load_npz(
    path: Path, key: str | None
) -> tuple[np.ndarray, np.ndarray | None, str, dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            others = [k for k in keys if k not in _NPZ_NOT_POSITIONS]
            if key is None and "positions" in keys:
                key = "positions"
            elif key is None and len(others) == 1:
                key = others[0]
            if key is None or key not in keys:
                what = "no 'positions' array" if key is None else f"no key {key!r}"
                raise ValueError(f"{path}: {what}; keys are {keys}; pass key=...")
            labels = z["labels"] if "labels" in keys and key != "labels" else None
            chem = {k: z[k] for k in _NPZ_CHEMISTRY if k in keys and k != key}
            return z[key], labels, key, chem
    except ValueError as e:
        if str(e).startswith(str(path)):
            raise
        raise ValueError(
            f"{path}: cannot read a numeric array ({e}); is it ragged or of non-numeric dtype?"
        ) from None


def _check_positions(path: Path, P: np.ndarray, sources: list[str]) -> np.ndarray:
    if not (np.issubdtype(P.dtype, np.integer) or np.issubdtype(P.dtype, np.floating)):
        raise ValueError(
            f"{path}: positions have non-numeric dtype {P.dtype}; expected real numbers"
        )
    if P.size == 0:
        raise ValueError(f"{path}: empty array of shape {P.shape}; no point clouds to read")
    if P.ndim != 3:
        hint = _hint_2d(*P.shape) if P.ndim == 2 else ""
        raise ValueError(f"{path}: positions must be 3-D (N, n, d), got shape {P.shape}{hint}")
    P = P.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(P).all(axis=(1, 2)))
    if bad.size:
        raise ValueError(
            f"{path}: {bad.size} of {len(P)} clouds contain NaN or inf (first: {sources[bad[0]]})"
        )
    _, n, d = P.shape
    if n < d + 2:
        raise ValueError(
            f"{path}: clouds have n = {n} points in d = {d} dimensions, too few; a "
            "density on centred clouds of n points in d dimensions needs "
            f"n >= d + 2 = {d + 2}"
        )
    return P


def _hint_2d(a: int, b: int) -> str:
    """What a 2-D array ``(a, b)`` may be, and the reshape that makes it ``(N, n, d)``."""
    flat = [f"P.reshape({a}, {b // d}, {d}) for {b // d} points in {d}-D"
            for d in (3, 2) if b % d == 0 and b // d >= d + 2]  # fmt: skip
    flat = ", or " + " or ".join(flat) if flat else ""
    return (
        f"; if it holds one cloud of {a} points in {b}-D, add a leading axis: P[None], "
        f"shape (1, {a}, {b}); if it holds {a} clouds whose coordinates are flattened or "
        f"missing, restore the coordinate axis: P[..., None] for 1-D points{flat}"
    )


def _check_labels(path: str, labels: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    L = np.asarray(labels)
    if not np.issubdtype(L.dtype, np.integer):
        if not (np.issubdtype(L.dtype, np.floating) and np.all(L == np.round(L))):
            raise ValueError(f"{path}: labels must be integers, got dtype {L.dtype}")
    if L.shape not in (shape, shape[1:]):
        raise ValueError(
            f"{path}: labels of shape {L.shape} do not fit {shape[0]} clouds of "
            f"{shape[1]} points; expected {shape} or {shape[1:]}"
        )
    return np.broadcast_to(L, shape).astype(np.int64)


def _drop_rank_deficient(path: Path, pc: PointClouds, rtol: float) -> PointClouds:
    P = pc.positions
    s = np.linalg.svd(P - P.mean(axis=1, keepdims=True), compute_uv=False)  # (N, d)
    drop = ~full_rank(torch.from_numpy(s), rtol).numpy()
    if not drop.any():
        return pc
    d = P.shape[-1]
    for i in np.flatnonzero(drop):
        r = int((s[i] > rtol * s[i, 0]).sum())
        how = {0: "all points coincide", 1: "points are collinear", 2: "points are coplanar"}
        pc.skipped.append(
            f"{pc.sources[i]}: rank deficient after centring (rank {r} < d = {d}: "
            f"{how.get(r, f'points span only {r} dimensions')}; smallest/largest "
            f"singular value {s[i, -1] / max(s[i, 0], 1e-300):.2e} <= rtol {rtol:g})"
        )
    first = pc.sources[int(np.flatnonzero(drop)[0])]
    if drop.all():
        raise ValueError(
            f"{path}: all {len(P)} clouds are rank deficient after centring "
            f"(rank < d = {d}, first: {first}); nothing left to model"
        )
    warnings.warn(
        f"{path}: skipped {int(drop.sum())} of {len(P)} rank-deficient clouds "
        f"(first: {first}); see PointClouds.skipped",
        stacklevel=3,
    )
    keep = ~drop
    return dataclasses.replace(  # the molecule's fields are the same for every cloud
        pc,
        positions=P[keep],
        labels=None if pc.labels is None else pc.labels[keep],
        sources=[s_ for s_, k in zip(pc.sources, keep) if k],
    )


def _read_xyz_files(
    root: Path, files: list[Path], prefix: str
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    frames, sources = [], []
    for f in files:
        got = _parse_xyz(f)
        if not got:
            raise ValueError(f"{f}: no frames (empty .xyz file)")
        frames += got
        sources += [f"{prefix}{f.name}#frame{j}" for j in range(len(got))]
    counts: dict[int, list[str]] = {}
    for (z, _), src in zip(frames, sources):
        counts.setdefault(len(z), []).append(src)
    if len(counts) > 1:
        parts = [
            f"{n} in {srcs[0]}" + (f" and {len(srcs) - 1} more" if len(srcs) > 1 else "")
            for n, srcs in sorted(counts.items())
        ]
        raise ValueError(
            f"{root}: ragged clouds, frames have different atom counts: " + "; ".join(parts)
        )
    labels = np.array([z for z, _ in frames], dtype=np.int64)
    return np.array([x for _, x in frames], dtype=np.float64), labels, sources


def _parse_xyz(f: Path) -> list[tuple[list[int], list[list[float]]]]:
    """The frames of one xyz file, each ``(atomic numbers (n,), positions (n, 3))``."""
    lines = f.read_text().splitlines()
    frames, i = [], 0
    while True:
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i == len(lines):
            return frames
        head = lines[i].split()[0]
        if not head.isdigit() or int(head) == 0:
            raise ValueError(
                f"{f}: line {i + 1} (frame {len(frames)}): expected a positive atom "
                f"count, got {lines[i].strip()!r}"
            )
        n = int(head)
        if i + 2 + n > len(lines):
            raise ValueError(
                f"{f}: frame {len(frames)} (line {i + 1}) announces {n} atoms but "
                f"the file ends after {max(len(lines) - i - 2, 0)}"
            )
        z, x = [], []
        for k in range(i + 2, i + 2 + n):
            cols = lines[k].split()
            where = f"{f}: line {k + 1} (frame {len(frames)})"
            if len(cols) < 4:
                raise ValueError(f"{where}: expected 'Symbol x y z', got {lines[k].strip()!r}")
            z.append(_atomic_number(cols[0], where))
            try:
                x.append([float(c) for c in cols[1:4]])
            except ValueError:
                raise ValueError(f"{where}: non-numeric coordinates {cols[1:4]}") from None
        frames.append((z, x))
        i += 2 + n


def _atomic_number(sym: str, where: str) -> int:
    if sym.lstrip("+-").isdigit():  # an atomic number, or any integer label
        return int(sym)
    z = ELEMENTS.get(sym[:1].upper() + sym[1:].lower())
    if z is None:
        raise ValueError(f"{where}: unknown element symbol {sym!r}")
    return z


def save_clouds(
    X: np.ndarray,
    out: str | os.PathLike,
    labels: np.ndarray | None = None,
    comment: str = "grassflow sample",
) -> list[Path]:
    """Write generated clouds ``X: (N, n, d)`` to ``out`` as ``.npy``, and beside it as
    ``.xyz`` for 3-D clouds (``labels``: ``(n,)`` shared atomic numbers, or None; ``comment``:
    the frames' comment line, e.g. which model drew them). With labels, they are also saved as
    ``<stem>_Z.npy``, so that `load_point_clouds` reads the ``.npy`` with its labels.

    Returns:
        the paths written.
    """
    out = Path(out).with_suffix(".npy")
    np.save(out, X)
    written = [out]
    if labels is not None:
        np.save(labels_path(out), np.asarray(labels, dtype=np.int64))
        written.append(labels_path(out))
    if X.shape[-1] == 3:
        labels = None if labels is None else np.broadcast_to(labels, X.shape[:2])
        write_xyz(out.with_suffix(".xyz"), X, labels, comment)
        written.append(out.with_suffix(".xyz"))
    return written
