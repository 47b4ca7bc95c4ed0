"""Molecules in files: SDF (MDL V2000) writing and reading, and RDKit's view of a molecule.

This module reads and writes molecule files; what a molecule carries with its conformers
(`PointClouds` with atomic numbers as labels, ``bonds``, ``bond_orders``, ``molblock`` and
``smiles``; `bond_table`, the checks of a bond table) is defined in
`grassflow.data.cloud_chemistry`, which it imports and which imports nothing from here.
`grassflow.data.point_clouds` calls `read_sdf` for ``.sdf`` files.

`write_sdf` is plain Python (no RDKit): one V2000 record per conformer, aromatic bonds as
MDL type 4. `read_sdf` uses RDKit (``pip install "grassflow[molecules]"``, imported only
when a molecule is read): every record is a conformer of one molecule, orders as RDKit
perceives them after sanitization. `molblock_charges` reads the formal charges of a V2000
molblock, `ensemble_chemistry` makes the orders and molblock of a SMILES's molecule (RDKit),
and `find_hand` the handedness that a molecule's conformers share.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..io import atomic_write
from .cloud_chemistry import (
    BOND_ORDERS,
    PointClouds,
    bond_table,
    check_bonds,
    element_symbol,
    npz_chemistry,
)
from .cloud_chemistry import ELEMENTS as ELEMENTS  # imported here before; kept importable

__all__ = [
    # defined in grassflow.data.cloud_chemistry; importable from here as before
    "BOND_ORDERS", "bond_table", "check_bonds", "npz_chemistry",
    # this module's own
    "SDF_SUFFIXES", "ensemble_chemistry", "find_hand", "molblock_charges", "read_sdf", "write_sdf",
]  # fmt: skip

SDF_SUFFIXES = (".sdf", ".sd", ".mol")
_MDL_TYPE = {1.0: 1, 2.0: 2, 3.0: 3, 1.5: 4}  # V2000 bond types; 4 is aromatic
_ORDER_OF = {"SINGLE": 1.0, "DOUBLE": 2.0, "TRIPLE": 3.0, "AROMATIC": 1.5}  # RDKit's names


def find_hand(X: np.ndarray, bonds: np.ndarray, margin: float = 0.1) -> tuple[int, ...] | None:
    """A handedness that every cloud shares: ``(c, j_1, ..., j_d)``, a point c and d of its
    bonded neighbours whose signed volume ``det[x_{j_k} - x_c]`` is positive in every cloud
    of ``X: (N, n, d)`` (neighbours ordered so), or None when no point's is (an achiral
    molecule, or conformers of both hands). Of several, the one farthest from flat: the
    largest ``min |det| / median |det|``, which must be at least ``margin`` (a planar centre,
    e.g. an amide N, never qualifies)."""
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[-1]
    if d < 2:  # a hand needs two neighbours to swap
        return None
    neighbours: dict[int, list[int]] = {}
    for i, j in np.asarray(bonds, dtype=np.int64).tolist():
        neighbours.setdefault(i, []).append(j)
        neighbours.setdefault(j, []).append(i)
    best, best_margin = None, margin
    for c, nb in sorted(neighbours.items()):
        if len(nb) < d:
            continue
        js = sorted(nb)[:d]
        det = np.linalg.det(X[:, js] - X[:, c : c + 1])
        if not ((det > 0).all() or (det < 0).all()):
            continue
        m = np.abs(det).min() / np.median(np.abs(det))
        if m >= best_margin:
            if det[0] < 0:  # swapping two neighbours flips the sign
                js[0], js[1] = js[1], js[0]
            best, best_margin = (c, *js), m
    return best


def write_sdf(
    path: str | os.PathLike,
    positions: np.ndarray,
    atomic_numbers: np.ndarray,
    bonds: np.ndarray,
    bond_orders: np.ndarray | None = None,
    titles: Sequence[str] | None = None,
    *,
    charges: np.ndarray | None = None,
) -> Path:
    """Write conformers of one molecule as an SDF, one MDL V2000 record per cloud.

    Args:
        path: the file (parent folders are made; written atomically).
        positions: ``(N, n, 3)`` Å, or one conformer ``(n, 3)``; kept to 4 decimals.
        atomic_numbers: ``(n,)`` integers 1 to 118.
        bonds: ``(B, 2)``, or ``(B, 3)`` with the order third (see `bond_table`).
        bond_orders: ``(B,)`` in `BOND_ORDERS`; None (and no third column): all single.
        titles: ``N`` one-line record titles (default: empty).
        charges: ``(n,)`` formal charges (``M  CHG`` lines), e.g. `molblock_charges` of
            the training data's molblock; None: all neutral.

    Returns:
        ``path``.

    Raises:
        ValueError: shapes that do not fit, non-finite or too large coordinates, labels that
            are not elements, a bad bond table, or more than 999 atoms or bonds (V2000).
    """
    path, where = Path(path), f"write_sdf {path}"
    P = np.asarray(positions, dtype=np.float64)
    P = P[None] if P.ndim == 2 else P
    if P.ndim != 3 or P.shape[-1] != 3:
        raise ValueError(f"{where}: positions must be (N, n, 3) or (n, 3), got {P.shape}")
    if not np.isfinite(P).all() or np.abs(P).max(initial=0.0) >= 1e5:
        raise ValueError(f"{where}: coordinates must be finite and below 1e5 in magnitude "
                         "(V2000 writes %10.4f)")  # fmt: skip
    N, n, _ = P.shape
    Z = np.asarray(atomic_numbers)
    if Z.shape != (n,) or not np.issubdtype(Z.dtype, np.integer) or ((Z < 1) | (Z > 118)).any():
        raise ValueError(f"{where}: atomic_numbers must be ({n},) integers 1 to 118, got "
                         f"shape {Z.shape}, dtype {Z.dtype}")  # fmt: skip
    bonds, orders = bond_table(bonds, n, where, bond_orders)
    if n > 999 or len(bonds) > 999:
        raise ValueError(f"{where}: {n} atoms and {len(bonds)} bonds; V2000 holds at most 999 "
                         "of each")  # fmt: skip
    titles = [""] * N if titles is None else list(titles)
    if len(titles) != N or any("\n" in t or "\r" in t or "$$$$" in t for t in titles):
        raise ValueError(f"{where}: titles must be {N} one-line strings")
    q = np.zeros(n, np.int64) if charges is None else np.asarray(charges)
    if q.shape != (n,) or not np.issubdtype(q.dtype, np.integer) or (np.abs(q) > 15).any():
        raise ValueError(f"{where}: charges must be ({n},) integers -15 to 15")
    orders = np.ones(len(bonds)) if orders is None else orders
    tail = [f"{i + 1:3d}{j + 1:3d}{_MDL_TYPE[o]:3d}  0"  # 1-based atom numbers
            for (i, j), o in zip(bonds.tolist(), orders.tolist())]  # fmt: skip
    charged = [(k + 1, int(q[k])) for k in np.flatnonzero(q)]
    for s in range(0, len(charged), 8):  # at most 8 atoms per M  CHG line
        part = charged[s : s + 8]
        tail.append(f"M  CHG{len(part):3d}" + "".join(f"{a:4d}{c:4d}" for a, c in part))
    tail += ["M  END", "$$$$"]
    counts = f"{n:3d}{len(bonds):3d}  0  0  0  0  0  0  0  0999 V2000"
    symbols = [element_symbol(z) for z in Z.tolist()]
    lines = []
    for title, X in zip(titles, P):
        lines += [title, "  grassflw          3D", "", counts]  # program name: 8 columns
        lines += [f"{x:10.4f}{y:10.4f}{z:10.4f} {s:<3} 0" + "  0" * 11
                  for s, (x, y, z) in zip(symbols, X.tolist())]  # fmt: skip
        lines += tail
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(("\n".join(lines) + "\n").encode()))
    return path


def molblock_charges(molblock: str) -> np.ndarray:
    """``(n,)`` int64 formal charges of a V2000 molblock: its ``M  CHG`` lines if it has any
    (they supersede the atom block's), else the atom block's charge codes."""
    lines = molblock.splitlines()
    if len(lines) < 4 or "V2000" not in lines[3]:
        raise ValueError("molblock_charges reads V2000 molblocks only (line 4 says "
                         f"{lines[3] if len(lines) > 3 else 'nothing'!r})")  # fmt: skip
    n = int(lines[3][:3])
    code = {1: 3, 2: 2, 3: 1, 5: -1, 6: -2, 7: -3}  # V2000 atom block charge codes
    atoms = lines[4 : 4 + n]
    q = np.array([code.get(int(line[36:39].strip() or 0), 0) for line in atoms], np.int64)
    chg = [line for line in lines if line.startswith("M  CHG")]
    if chg:
        q[:] = 0
        for line in chg:
            f = line[6:].split()
            for a, c in zip(f[1::2], f[2::2]):
                q[int(a) - 1] = int(c)
    return q


def read_sdf(path: str | os.PathLike) -> PointClouds:
    """Conformers of one molecule from an SDF (``.sdf``, ``.sd``, ``.mol``), read by RDKit
    (``SDMolSupplier(removeHs=False, sanitize=True)``). `load_point_clouds` calls this, then
    checks the clouds as for any file (enough points, full rank).

    Returns:
        `PointClouds`: positions ``(N, n, 3)``, labels ``(N, n)`` atomic numbers, bonds
        and orders (aromatic: 1.5), the first record's molblock (``Chem.MolToMolBlock``) and
        canonical SMILES (hydrogens implicit), sources ``"<name>#record<i>"``.

    Raises:
        ImportError: RDKit is not installed.
        ValueError: no records, a record RDKit cannot read (its index and RDKit's reason),
            atoms without 3-D coordinates, a bond type other than single, double, triple or
            aromatic, or records of another molecule than the first (atoms, elements, bonds,
            orders or charges).
    """
    try:
        from rdkit import Chem, rdBase
    except ImportError as e:
        raise ImportError('reading SDF files needs RDKit: pip install "grassflow[molecules]"'
                          ) from e  # fmt: skip
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if not path.read_bytes().strip():  # RDKit raises an OSError for an empty file
        raise ValueError(f"{path}: no records (empty SDF)")
    with rdBase.BlockLogs():  # the errors below say what RDKit would log
        supplier = Chem.SDMolSupplier(str(path), removeHs=False, sanitize=True)
        mols = [supplier[i] for i in range(len(supplier))]
        for i, mol in enumerate(mols):
            if mol is None:
                raise ValueError(f"{path}: record {i} cannot be read ({_why(Chem, supplier, i)}); "
                                 "fix or remove it")  # fmt: skip
    if not mols:
        raise ValueError(f"{path}: no records")
    P, graphs = [], []
    for i, mol in enumerate(mols):
        where = f"{path}: record {i}"
        if mol.GetNumAtoms() == 0:
            raise ValueError(f"{where} has no atoms")
        conf = mol.GetConformer() if mol.GetNumConformers() else None
        x = None if conf is None else conf.GetPositions()
        if x is None or not conf.Is3D() or not x[:, 2].any():
            raise ValueError(f"{where} has atoms without coordinates (no 3-D conformer: the z "
                             "column is all zero or the record is 2-D); embed the molecule in "
                             "3-D first, e.g. `grassflow data conformers SMILES`")  # fmt: skip
        P.append(x)
        graphs.append(_graph(mol, where))
    for i, g in enumerate(graphs[1:], start=1):
        _same_molecule(path, i, graphs[0], g)
    Z, _, bonds, orders = graphs[0]
    return PointClouds(
        np.stack(P), np.broadcast_to(Z, (len(P), len(Z))).copy(),
        [f"{path.name}#record{i}" for i in range(len(P))], [], labels_from="sdf atoms",
        bonds=bonds, bond_orders=orders, molblock=Chem.MolToMolBlock(mols[0]),
        smiles=Chem.MolToSmiles(Chem.RemoveHs(mols[0])),
    )  # fmt: skip


def _why(Chem, supplier, i: int) -> str:
    """RDKit's reason for rejecting record ``i``."""
    m = Chem.MolFromMolBlock(supplier.GetItemText(i), sanitize=False, removeHs=False)
    if m is None:
        return "not a valid molblock"
    try:
        Chem.SanitizeMol(m)
    except Exception as e:  # RDKit's sanitization exceptions share no public base
        return f"RDKit: {str(e).strip()}"
    return "RDKit rejected it"


def _graph(mol, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(atomic numbers (n,), charges (n,), bonds (B, 2), orders (B,))`` of an RDKit mol."""
    Z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()], np.int64)
    q = np.array([a.GetFormalCharge() for a in mol.GetAtoms()], np.int64)
    pairs, orders = [], []
    for k, b in enumerate(mol.GetBonds()):
        i, j, t = b.GetBeginAtomIdx(), b.GetEndAtomIdx(), str(b.GetBondType())
        if t not in _ORDER_OF:
            raise ValueError(f"{where}: bond {k} ({i}, {j}) is {t}; grassflow keeps single, "
                             "double, triple and aromatic bonds only")  # fmt: skip
        pairs.append((i, j))
        orders.append(_ORDER_OF[t])
    bonds, o = bond_table(np.array(pairs, np.int64).reshape(-1, 2), len(Z), where, orders)
    return Z, q, bonds, o


def _same_molecule(path: Path, i: int, first: tuple, other: tuple) -> None:
    (Z0, q0, b0, o0), (Z, q, b, o) = first, other
    what = None
    if len(Z) != len(Z0):
        what = f"{len(Z)} atoms, record 0 has {len(Z0)}"
    elif (Z != Z0).any():
        k = int(np.flatnonzero(Z != Z0)[0])
        what = (f"{element_symbol(Z[k])} at atom {k}, record 0 has {element_symbol(Z0[k])} "
                "(another element sequence)")  # fmt: skip
    elif b.shape != b0.shape or (b != b0).any():
        extra = set(map(tuple, b.tolist())) ^ set(map(tuple, b0.tolist()))
        i_, j_ = min(extra)
        only = i if (i_, j_) in set(map(tuple, b.tolist())) else 0
        what = f"a different bond table than record 0 (bond {i_}-{j_} only in record {only})"
    elif (o != o0).any():
        k = int(np.flatnonzero(o != o0)[0])
        what = f"bond {b[k, 0]}-{b[k, 1]} of order {o[k]:g}, record 0 of order {o0[k]:g}"
    elif (q != q0).any():
        k = int(np.flatnonzero(q != q0)[0])
        what = f"charge {q[k]:+d} on atom {k}, record 0 has {q0[k]:+d}"
    if what:
        raise ValueError(f"{path}: a file with mixed molecules: record {i} has {what}; "
                         "one molecule per file")  # fmt: skip


def ensemble_chemistry(
    smiles: str, positions: np.ndarray, atomic_numbers: np.ndarray, bonds: np.ndarray
) -> tuple[np.ndarray, str]:
    """Bond orders ``(B,)`` (in ``bonds`` order) and a molblock at ``positions: (n, 3)`` of
    the molecule that `grassflow.data.conformers.conformer_ensemble` builds from ``smiles``
    (RDKit: ``AddHs(MolFromSmiles(smiles))``), checked against ``atomic_numbers (n,)`` and
    ``bonds (B, 2)``.

    Raises:
        ImportError: RDKit is not installed.
        ValueError: ``smiles`` does not parse, or names another molecule.
    """
    try:
        from rdkit import Chem
        from rdkit.Geometry import Point3D
    except ImportError as e:
        raise ImportError('molecules need RDKit: pip install "grassflow[molecules]"') from e
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"RDKit cannot parse the SMILES {smiles!r}")
    mol = Chem.AddHs(mol)
    Z, _, b, o = _graph(mol, f"SMILES {smiles!r}")
    same = Z.tolist() == np.asarray(atomic_numbers).tolist()
    if not same or not np.array_equal(b, check_bonds(bonds, len(Z), f"SMILES {smiles!r}")):
        raise ValueError(f"SMILES {smiles!r} (with hydrogens) is not the molecule of these "
                         "atoms and bonds")  # fmt: skip
    conf = Chem.Conformer(len(Z))
    for k, p in enumerate(np.asarray(positions, dtype=np.float64).tolist()):
        conf.SetAtomPosition(k, Point3D(*p))
    conf.Set3D(True)
    mol.AddConformer(conf, assignId=True)
    return o, Chem.MolToMolBlock(mol)
