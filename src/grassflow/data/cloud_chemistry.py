"""What point clouds carry: the `PointClouds` container, elements, and a molecule's bonds.

This module defines the data; it reads and writes no files. `grassflow.data.point_clouds`
reads clouds from ``.npy``, ``.npz``, ``.xyz`` and (through
`grassflow.data.molecule_files`) ``.sdf`` files into `PointClouds`, and
`grassflow.data.molecule_files` reads and writes molecules as SDF; both import from here,
never the other way round.

Labels are integers, atomic numbers for chemistry: `ELEMENTS` maps element symbols to them
(``X``, a dummy atom, is 0) and `element_symbol` maps them back. A molecule travels with its
conformers in `PointClouds`: ``labels`` are atomic numbers, ``bonds: (B, 2)`` int64 atom
index pairs ``i < j`` (0-based, sorted, no duplicates), ``bond_orders: (B,)`` float64 in
`BOND_ORDERS` (1.5: aromatic), ``molblock`` an MDL V2000 molblock of the first conformer
(charges, explicit hydrogens) from which RDKit rebuilds the molecule, and ``smiles``.
`bond_table` is the one validation of bonds that every reader uses; `npz_chemistry` checks
the chemistry fields given as arrays (an ``.npz``'s) against the clouds' labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BOND_ORDERS", "ELEMENTS", "PointClouds", "bond_table", "check_bonds",
           "element_symbol", "npz_chemistry"]  # fmt: skip

_SYMBOLS = (
    "X H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca "
    "Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd "
    "In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re Os "
    "Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr Rf "
    "Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()
#: element symbol -> atomic number (``X``, a dummy or unknown atom, is 0)
ELEMENTS: dict[str, int] = {s: z for z, s in enumerate(_SYMBOLS)}
_SYMBOL_OF: dict[int, str] = {z: s for s, z in ELEMENTS.items()}


def element_symbol(label: int) -> str:
    """The xyz symbol of a label: its element for 1 to 118, ``X`` for 0, and the integer
    itself (``"-1"``, ``"200"``) for labels that are not atomic numbers, which
    `grassflow.data.point_clouds.load_point_clouds` reads back as the same label."""
    return _SYMBOL_OF.get(int(label), str(int(label)))


@dataclass
class PointClouds:
    """Point clouds as read from a file or folder, with their labels and chemistry.

    Attributes:
        positions: ``(N, n, d)`` float64 positions, as read (not centred).
        labels: ``(N, n)`` int64 per-point labels (atomic numbers for ``.xyz``), or ``None``.
        sources: ``N`` strings naming where each cloud came from, e.g. ``"mols/a.xyz#frame2"``
            or ``"shapes.npy[17]"``.
        skipped: human-readable lines, one per dropped cloud: its source and why.
        labels_from: where the labels came from (``"shapes_Z.npy"``, ``"shapes.npz:labels"``,
            ``"xyz element symbols"``, ``"sdf atoms"``), or None.
        bonds: ``(B, 2)`` int64 atom index pairs ``i < j``, sorted, no duplicates, of the one
            molecule all clouds are conformers of; None for clouds without a graph.
        bond_orders: ``(B,)`` float64 orders 1, 2, 3 or 1.5 (aromatic), or None.
        molblock: an MDL V2000 molblock of the first cloud (bonds, charges, explicit
            hydrogens) from which RDKit rebuilds the molecule, or None.
        smiles: the molecule's SMILES, or None.
    """

    positions: np.ndarray
    labels: np.ndarray | None
    sources: list[str]
    skipped: list[str]
    labels_from: str | None = None
    bonds: np.ndarray | None = None
    bond_orders: np.ndarray | None = None
    molblock: str | None = None
    smiles: str | None = None


BOND_ORDERS = (1.0, 1.5, 2.0, 3.0)
"""The bond orders grassflow keeps: single, aromatic, double, triple."""


def check_bonds(bonds: np.ndarray, n: int, where: str) -> np.ndarray:
    """``bonds: (B, 2)`` (or ``(B, 3)``, the orders dropped) atom index pairs of a molecule of
    ``n`` atoms, validated and returned as ``(B, 2)`` int64, ``i < j``, sorted; ``where``
    starts the error messages (a file name). See `bond_table`."""
    return bond_table(bonds, n, where)[0]


def bond_table(
    bonds: np.ndarray, n: int, where: str, bond_orders: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate a bond table and put it in canonical order.

    Args:
        bonds: ``(B, 2)`` 0-based atom index pairs, or ``(B, 3)`` with the bond order third.
        n: atoms of the molecule.
        where: what the table belongs to, first in every error message.
        bond_orders: ``(B,)`` orders, or None (then the third column, if any, is used).

    Returns:
        ``(bonds, orders)``: ``(B, 2)`` int64 pairs ``i < j`` sorted lexicographically, and
        ``(B,)`` float64 orders permuted alike (None when none were given).

    Raises:
        ValueError: the wrong shape, non-integer indices, an index outside ``[0, n)``, a
            bond of an atom to itself, a duplicate bond, orders not in `BOND_ORDERS` or
            not ``(B,)``, or a third column that disagrees with ``bond_orders``.
    """
    b = np.asarray(bonds)
    if b.ndim != 2 or b.shape[1] not in (2, 3):
        raise ValueError(f"{where}: a bond table must be (B, 2) atom index pairs or (B, 3) "
                         f"with the bond order third, got shape {b.shape}")  # fmt: skip
    if not (np.issubdtype(b.dtype, np.integer) or np.issubdtype(b.dtype, np.floating)):
        raise ValueError(f"{where}: bonds must be numbers, got dtype {b.dtype}")
    if b.shape[1] == 3:
        third = b[:, 2].astype(np.float64)
        if bond_orders is not None and not np.array_equal(np.asarray(bond_orders), third):
            raise ValueError(f"{where}: the bonds' third column and bond_orders disagree")
        bond_orders, b = third, b[:, :2]
    if np.issubdtype(b.dtype, np.floating) and not (np.isfinite(b) & (b == np.round(b))).all():
        raise ValueError(f"{where}: bond atom indices must be integers")
    ij = b.astype(np.int64)
    for k, (i, j) in enumerate(ij.tolist()):
        if not (0 <= i < n and 0 <= j < n):
            raise ValueError(f"{where}: bond {k} ({i}, {j}) names an atom index out of "
                             f"range; {n} atoms have 0-based indices 0 to {n - 1}")  # fmt: skip
        if i == j:
            raise ValueError(f"{where}: bond {k} ({i}, {j}) is a self-bond (atom {i} to itself)")
    o = None
    if bond_orders is not None:
        o = np.asarray(bond_orders, dtype=np.float64)
        if o.shape != (len(ij),):
            raise ValueError(f"{where}: bond_orders of shape {o.shape} do not fit {len(ij)} "
                             f"bonds; expected ({len(ij)},)")  # fmt: skip
        bad = np.flatnonzero(~np.isin(o, BOND_ORDERS))
        if bad.size:
            raise ValueError(f"{where}: bond {bad[0]} has order {o[bad[0]]:g}; orders are "
                             "1, 2, 3 or 1.5 (aromatic)")  # fmt: skip
    ij = np.sort(ij, axis=1)
    perm = np.lexsort((ij[:, 1], ij[:, 0]))
    ij = ij[perm]
    dup = np.flatnonzero((ij[1:] == ij[:-1]).all(axis=1))
    if dup.size:
        i, j = ij[dup[0]]
        raise ValueError(f"{where}: duplicate bonds: atoms {i} and {j} are bonded twice")
    return ij, None if o is None else o[perm]


def npz_chemistry(where: str, arrays: dict, labels: np.ndarray | None, n: int) -> dict:
    """The `PointClouds` chemistry fields from an ``.npz``'s arrays ``bonds`` (``(B, 2)`` or
    ``(B, 3)``), ``bond_orders`` ``(B,)``, ``smiles`` and ``molblock`` (0-d strings), any of
    them absent; ``labels``: the checked ``(N, n)`` labels or None.

    Returns:
        a dict with the keys ``bonds``, ``bond_orders``, ``molblock`` and ``smiles``.

    Raises:
        ValueError: bonds without labels, or with labels that differ between clouds (one
            molecule per file), orders without bonds, a bad bond table, strings that are not
            0-d, or a molblock of another molecule (atom count, elements or bonds).
    """
    out = {k: None for k in ("bonds", "bond_orders", "molblock", "smiles")}
    for k in ("smiles", "molblock"):
        if k in arrays:
            s = np.asarray(arrays[k])
            if s.ndim != 0 or s.dtype.kind not in "US":
                raise ValueError(f"{where}: {k} must be a 0-d string array, e.g. np.array("
                                 f"'CCO'), got dtype {s.dtype}, shape {s.shape}")  # fmt: skip
            out[k] = s.item().decode() if s.dtype.kind == "S" else str(s)
    if "bonds" not in arrays:
        if "bond_orders" in arrays:
            raise ValueError(f"{where}: bond_orders without bonds")
        return out
    if labels is None:
        raise ValueError(f"{where}: bonds without labels; add the atoms' atomic numbers as "
                         "'atomic_numbers' (n,)")  # fmt: skip
    if (labels != labels[:1]).any():
        raise ValueError(f"{where}: bonds with labels that differ between clouds; a file with "
                         "bonds holds conformers of one molecule")  # fmt: skip
    out["bonds"], out["bond_orders"] = bond_table(arrays["bonds"], n, f"{where}: bonds",
                                                  arrays.get("bond_orders"))  # fmt: skip
    if out["molblock"] is not None:
        _check_molblock(where, out["molblock"], labels[0], out["bonds"])
    return out


def _check_molblock(where: str, molblock: str, Z: np.ndarray, bonds: np.ndarray) -> None:
    """The molblock's atoms and bonds are those of ``Z`` and ``bonds`` (V2000 only)."""
    lines = molblock.splitlines()
    if len(lines) < 4 or "V2000" not in lines[3]:
        return  # V3000 (over 999 atoms): left to RDKit
    try:
        n, B = int(lines[3][:3]), int(lines[3][3:6])
        sym = [line[31:34].strip() for line in lines[4 : 4 + n]]
        mb = [(int(line[:3]) - 1, int(line[3:6]) - 1) for line in lines[4 + n : 4 + n + B]]
    except ValueError:
        raise ValueError(f"{where}: molblock is not a V2000 molblock") from None
    if [ELEMENTS.get(s, -1) for s in sym] != Z.tolist():
        raise ValueError(f"{where}: molblock atoms {sym} are not the atomic numbers {Z.tolist()}")
    if sorted(tuple(sorted(p)) for p in mb) != [tuple(p) for p in bonds.tolist()]:
        raise ValueError(f"{where}: molblock bonds are not the bonds array's")
