"""QM9 positional: the 19-atom QM9 molecules split as E(n)-NF does (GrCNF paper, §5.3).

The molecules come from the PyPI package ``qm9pack`` (install with ``pip install -e ".[qm9]"``),
whose wheel ships the 130,831 characterized QM9 molecules (the 133,885 GDB-9 molecules less the
3,054 of ``uncharacterized.txt``) as CSV files with B3LYP/6-31G(2df,p) geometries in Å.

The split is cormorant's ``gen_splits_gdb9``, which EGNN and E-NF reuse: the characterized
molecules in index order are permuted with ``np.random.seed(0); np.random.permutation(130831)``,
and the permutation is cut into train = the first 100,000, valid = the next 17,748 and
test = the last 13,083 (``int(0.1 * 130831)``). E-NF then keeps the molecules with exactly 19
atoms (hydrogens included) and models only their positions, centred per molecule. Each split
is returned in QM9 index order, the order of cormorant's ``train/valid/test.npz`` files.

Counts (checked against cormorant's ``test.npz``, whose 13,083 indices this split reproduces):
19-atom molecules train / valid / test = 13,832 / 2,501 / 1,813. None of them is rank deficient
(all 19 atoms on a line or a plane), so every one is a point of Gr(3, 19) after centring.

Parsing the 225 MB of CSVs takes about a second; the result is cached in one ``.npz`` file.

References:
    Ramakrishnan et al. Quantum chemistry structures and properties of 134 kilo molecules.
    Scientific Data 1, 140022 (2014).
    Anderson, Hy, Kondor. Cormorant: Covariant Molecular Neural Networks (NeurIPS 2019).
    Garcia Satorras et al. E(n) Equivariant Normalizing Flows (NeurIPS 2021).
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..manifolds.shape_space import full_rank

__all__ = [
    "ATOMIC_NUMBERS",
    "CACHE_NAME",
    "CACHE_VERSION",
    "N_ATOMS",
    "N_GDB9",
    "N_MOLECULES",
    "N_UNCHARACTERIZED",
    "SPLITS",
    "SPLIT_SIZES",
    "SPLIT_SIZES_19",
    "gdb9_split_positions",
    "load_qm9_positional",
    "qm9pack_data_dir",
    "rank_deficient",
]

N_GDB9 = 133_885  # molecules in GDB-9 / QM9, indices 1..133885
N_UNCHARACTERIZED = 3_054  # failed the geometry consistency check; left out by cormorant
N_MOLECULES = N_GDB9 - N_UNCHARACTERIZED  # 130,831 characterized molecules
SPLITS: tuple[str, ...] = ("train", "valid", "test")
SPLIT_SIZES: dict[str, int] = {
    "train": 100_000,
    "valid": N_MOLECULES - 100_000 - int(0.1 * N_MOLECULES),  # 17,748
    "test": int(0.1 * N_MOLECULES),  # 13,083
}
N_ATOMS = 19  # E-NF's "QM9 positional" keeps the molecules with this many atoms
SPLIT_SIZES_19: dict[str, int] = {"train": 13_832, "valid": 2_501, "test": 1_813}
ATOMIC_NUMBERS: dict[str, int] = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9}

CACHE_NAME = "qm9_positional_19.npz"
CACHE_VERSION = 1

_CSV_FILES = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
_COLUMNS = ("Index", "N_atoms", "Elements", "XYZ_Ang")
_INSTALL_HINT = 'pip install -e ".[qm9]" (or pip install qm9pack)'


# ------------------------------------------------------------------ qm9pack files
def qm9pack_data_dir() -> Path:
    """The folder of CSV files inside the installed ``qm9pack`` package.

    The package is located without being imported: qm9pack 1.0.3's ``__init__`` imports
    ``pkg_resources`` (removed in setuptools 82) and pandas, neither of which is needed to
    read its data.

    Raises:
        ImportError: ``qm9pack`` is not installed.
        FileNotFoundError: the installed package lacks one of its CSV files.
    """
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"QM9 positional data needs the package qm9pack: {_INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    missing = [name for name in _CSV_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"qm9pack at {folder.parent} lacks {', '.join(missing)}; reinstall it: {_INSTALL_HINT}"
        )
    return folder


def _counted(lines: Iterator[str], bar: tqdm) -> Iterator[str]:
    """Pass ``lines`` through, advancing ``bar`` by their length every ~4 MB (cheap)."""
    done = 0
    for line in lines:
        done += len(line)
        if done > 1 << 22:
            bar.update(done)
            done = 0
        yield line
    bar.update(done)


def _csv_rows(paths: list[Path], progress: bool) -> Iterator[tuple[Path, list[int], list[str]]]:
    """``(path, column positions of _COLUMNS, row)`` for every molecule row of the CSVs."""
    total = sum(p.stat().st_size for p in paths)
    # delay: the bar only appears when parsing is slow (e.g. a busy machine)
    with tqdm(
        total=total,
        desc="parsing QM9",
        unit="B",
        unit_scale=True,
        disable=not progress,
        delay=2.0,
        dynamic_ncols=True,
    ) as bar:
        for path in paths:
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.reader(_counted(f, bar))
                header = next(reader, [])
                if not set(_COLUMNS) <= set(header):
                    raise ValueError(
                        f"{path}: expected the columns {', '.join(_COLUMNS)}; "
                        f"found {', '.join(header)}"
                    )
                cols = [header.index(c) for c in _COLUMNS]
                for row in reader:
                    if len(row) != len(header):
                        raise ValueError(
                            f"{path}, line {reader.line_num}: {len(row)} fields, "
                            f"expected {len(header)}"
                        )
                    yield path, cols, row


def _read_qm9pack(folder: Path, n_atoms: int, progress: bool) -> dict[str, np.ndarray]:
    """Read every molecule's index and atom count, and the atoms of those with ``n_atoms``.

    Returns:
        ``index (M,)`` (1-based QM9 indices, file order), ``num_atoms (M,)``, and for the
        rows with ``num_atoms == n_atoms``: ``rows (K,)`` (positions in ``index``),
        ``positions (K, n_atoms, 3)`` float64 raw coordinates in Å and
        ``charges (K, n_atoms)`` atomic numbers.
    """
    index, num_atoms, rows, positions, charges = [], [], [], [], []
    for path, (ci, cn, ce, cx), row in _csv_rows([folder / f for f in _CSV_FILES], progress):
        n = int(row[cn])
        index.append(int(row[ci]))
        num_atoms.append(n)
        if n != n_atoms:
            continue
        # XYZ_Ang is "[[x,y,z],...]" (a few values in 1.2E-6 notation);
        # Elements is "['C','H',...]", in the same atom order
        xyz = np.array(re.sub(r"[\[\]]", "", row[cx]).split(","), dtype=np.float64)
        symbols = re.findall(r"[A-Z][a-z]?", row[ce])
        if xyz.size != 3 * n or len(symbols) != n:
            raise ValueError(
                f"{path}: molecule {row[ci]} has N_atoms = {n} but {xyz.size} coordinates "
                f"and {len(symbols)} elements"
            )
        unknown = set(symbols) - set(ATOMIC_NUMBERS)
        if unknown:
            raise ValueError(f"{path}: molecule {row[ci]} has unknown elements {unknown}")
        rows.append(len(index) - 1)
        positions.append(xyz.reshape(n, 3))
        charges.append([ATOMIC_NUMBERS[s] for s in symbols])
    return {
        "index": np.array(index, dtype=np.int64),
        "num_atoms": np.array(num_atoms, dtype=np.int64),
        "rows": np.array(rows, dtype=np.int64),
        "positions": np.array(positions, dtype=np.float64).reshape(-1, n_atoms, 3),
        "charges": np.array(charges, dtype=np.int64).reshape(-1, n_atoms),
    }


# ------------------------------------------------------------------ split
def gdb9_split_positions(n_molecules: int = N_MOLECULES) -> dict[str, np.ndarray]:
    """Cormorant's ``gen_splits_gdb9`` split as positions in the characterized-molecule list.

    ``np.random.seed(0); perm = np.random.permutation(n_molecules)`` cut into 100,000 /
    17,748 / 13,083. The legacy global generator is reproduced with a private
    ``RandomState(0)`` (same stream), so NumPy's global random state is left alone.

    Returns:
        ``{"train": (100000,), "valid": (17748,), "test": (13083,)}`` int64 positions into
        the characterized molecules sorted by QM9 index, each in permutation order.
    """
    if n_molecules != N_MOLECULES:
        raise ValueError(
            f"the cormorant split is defined for the {N_MOLECULES} characterized QM9 "
            f"molecules; got {n_molecules}"
        )
    perm = np.random.RandomState(0).permutation(n_molecules)
    cuts = np.cumsum([SPLIT_SIZES[s] for s in SPLITS])
    train, valid, test, extra = np.split(perm, cuts)
    assert extra.size == 0  # the three sizes add up to n_molecules by construction
    return {"train": train, "valid": valid, "test": test}


def _build(progress: bool) -> dict[str, np.ndarray]:
    """Parse qm9pack and cut the 19-atom molecules of each split (sorted by QM9 index)."""
    data = _read_qm9pack(qm9pack_data_dir(), N_ATOMS, progress)
    order = np.argsort(data["index"], kind="stable")  # the CSVs are in index order; not relied on
    index, num_atoms = data["index"][order], data["num_atoms"][order]
    n_distinct = np.unique(index).size
    if n_distinct != N_MOLECULES or index.size != N_MOLECULES or index[0] < 1 or index[-1] > N_GDB9:
        # the permutation indexes this exact list; any other list gives a different split
        raise ValueError(
            f"qm9pack should hold the {N_MOLECULES} characterized QM9 molecules with distinct "
            f"indices in [1, {N_GDB9}]; found {index.size} rows, {n_distinct} distinct indices"
        )
    row_of = np.full(index.size, -1, dtype=np.int64)  # sorted position -> 19-atom row
    row_of[np.argsort(order)[data["rows"]]] = np.arange(data["rows"].size)
    out: dict[str, np.ndarray] = {}
    for split, where in gdb9_split_positions().items():
        where = np.sort(where)  # QM9 index order, as cormorant's npz files
        where = where[num_atoms[where] == N_ATOMS]
        take = row_of[where]
        P = data["positions"][take]
        out[split] = P - P.mean(axis=1, keepdims=True)
        out[f"{split}_index"] = index[where]
        out[f"{split}_charges"] = data["charges"][take]
    return out


# ------------------------------------------------------------------ cache
def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` to a temp file next to ``path``, then ``os.replace``: never half-written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        # mkstemp makes the file owner-only; give it the usual umask-based mode instead
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached split, or ``None`` when it was written by another format version."""
    hint = "delete it or pass refresh=True to rebuild it from qm9pack"
    try:
        with np.load(path, allow_pickle=False) as z:
            version = int(z["format_version"])
            if version != CACHE_VERSION:
                return None
            out = {k: z[k] for k in z.files if k != "format_version"}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"QM9 cache {path} is unreadable ({err}); {hint}") from err
    for split in SPLITS:
        keys = (split, f"{split}_index", f"{split}_charges")
        if not all(k in out for k in keys):
            raise ValueError(f"QM9 cache {path} lacks {', '.join(keys)}; {hint}")
        P, idx, Z = (out[k] for k in keys)
        m = len(P)
        if P.shape != (m, N_ATOMS, 3) or idx.shape != (m,) or Z.shape != (m, N_ATOMS):
            raise ValueError(
                f"QM9 cache {path}: {split} arrays have shapes {P.shape}, {idx.shape}, "
                f"{Z.shape}; expected (N, {N_ATOMS}, 3), (N,), (N, {N_ATOMS}); {hint}"
            )
        if m == 0:
            raise ValueError(f"QM9 cache {path}: split {split!r} is empty; {hint}")
        if not np.issubdtype(P.dtype, np.floating):
            raise ValueError(
                f"QM9 cache {path}: {split} positions have dtype {P.dtype}, not floating; {hint}"
            )
        for key, a in ((f"{split}_index", idx), (f"{split}_charges", Z)):
            if not np.issubdtype(a.dtype, np.integer):
                raise ValueError(
                    f"QM9 cache {path}: {key} has dtype {a.dtype}, not integer; {hint}"
                )
        bad = ~np.isfinite(P).all(axis=(1, 2))
        if bad.any():
            raise ValueError(
                f"QM9 cache {path}: {int(bad.sum())} {split} molecule(s) with NaN or inf "
                f"positions, first at row {int(bad.argmax())}; {hint}"
            )
    return out


def load_qm9_positional(
    cache_dir: str | os.PathLike = "data", *, refresh: bool = False, progress: bool = True
) -> dict[str, np.ndarray]:
    """The 19-atom QM9 molecules in E-NF's train/valid/test split.

    The first call parses qm9pack's CSVs (about a second) and writes
    ``cache_dir/qm9_positional_19.npz``; later calls read that file, and need no qm9pack.
    A cache of another format version is rebuilt (with a warning).

    Args:
        cache_dir: folder of the cache file (created if missing).
        refresh: rebuild the cache from qm9pack even if it exists.
        progress: show a progress bar while parsing (only if parsing takes > 2 s).

    Returns:
        For each split ``s`` in ``("train", "valid", "test")``, sorted by QM9 index:
        ``s``: float64 ``(N_s, 19, 3)`` positions in Å, centred per molecule (mean atom
        position 0); ``s_index``: int64 ``(N_s,)`` QM9 indices (1-based, as in
        ``gdb_<index>``); ``s_charges``: int64 ``(N_s, 19)`` atomic numbers (H=1, C=6, N=7,
        O=8, F=9), atom order as ``s``. ``N_s`` is `SPLIT_SIZES_19`.

    Raises:
        ImportError: the cache must be built and ``qm9pack`` is not installed.
        ValueError: the cache file is unreadable or malformed (delete it or pass
            ``refresh=True``), or qm9pack does not hold the expected molecules.
    """
    path = Path(cache_dir) / CACHE_NAME
    if path.exists() and not refresh:
        cached = _read_cache(path)
        if cached is not None:
            return cached
        warnings.warn(
            f"QM9 cache {path} has another format version than {CACHE_VERSION}; rebuilding it",
            stacklevel=2,
        )
    out = _build(progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_savez(path, {"format_version": np.array(CACHE_VERSION), **out})
    return out


# ------------------------------------------------------------------ analysis
def rank_deficient(P: np.ndarray, rtol: float = 1e-6) -> np.ndarray:
    """Which configurations have centred positions of rank < 3 (not a point of Gr(3, n)).

    Args:
        P: ``(N, n, 3)`` positions (centred or not; they are centred here).
        rtol: a singular value below ``rtol`` times the largest counts as zero.

    Returns:
        bool ``(N,)``: True where the atoms lie on a plane, a line or a point.
    """
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 3 or P.shape[-1] != 3:
        raise ValueError(f"expected positions of shape (N, n, 3), got {P.shape}")
    s = np.linalg.svd(P - P.mean(axis=1, keepdims=True), compute_uv=False)
    return ~full_rank(torch.from_numpy(s), rtol).numpy()
