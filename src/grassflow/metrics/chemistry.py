"""Chemistry of generated conformers of one molecule: MMFF94 energies, torsions, stereo.

The molecule is an RDKit ``Mol`` *template* with explicit hydrogens whose atom order is that
of the conformer arrays ``X: (N, n, 3)`` (Å, numpy or torch); `template_from_smiles` and
`template_from_molblock` make one. Samples are compared with reference (test) conformers:

- `mmff_energies` and `energy_w1_capped` (the W1 of MMFF94 energies, broken samples capped);
- `torsion_quads`, `dihedrals`, `torsion_jsd` (per rotatable bond, histograms on (-pi, pi]);
- `stereo_signature`, `reference_stereo`, `stereo_kept` (tetrahedral centres, E/Z bonds);
- `half_split`: a two-sample metric between two random halves of the reference, the
  yardstick a model's value is read against (issue 35: within 2x of it);
- `chemistry_summary`: all of them, with `bonds_kept_fraction` and `closest_pair_fraction`.

RDKit is optional: ``pip install "grassflow[molecules]"``.

References:
    Halgren. Merck molecular force field I-V. J. Comput. Chem. 17 (1996).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .boltzmann import energy_w1
from .bonds import bond_angle_error, bond_lengths, bonds_kept_fraction
from .contacts import closest_pair_fraction
from .histograms import histogram, jsd

if TYPE_CHECKING:
    from rdkit.Chem import Mol

__all__ = ["alanine_dipeptide_phi_psi", "chemistry_summary", "dihedrals", "energy_cap",
           "energy_w1_capped", "half_split", "mmff_energies", "reference_stereo",
           "stereo_elements", "stereo_kept", "stereo_signature", "template_from_molblock",
           "template_from_smiles", "torsion_jsd", "torsion_quads"]  # fmt: skip


def _chem():
    # a copy of grassflow.data.conformers' guard: importing its private helper is not allowed
    try:
        from rdkit import Chem
        from rdkit.Chem import AllChem
    except ImportError as e:
        raise ImportError('chemistry metrics need RDKit: pip install "grassflow[molecules]"') from e
    return Chem, AllChem


def _clouds(X, name: str = "X", mol=None) -> np.ndarray:
    X = np.asarray(X.detach().cpu() if hasattr(X, "detach") else X, dtype=np.float64)
    if X.ndim != 3 or X.shape[0] < 1 or X.shape[2] != 3:
        raise ValueError(f"{name} must be (N, n, 3) conformers with N >= 1, got {X.shape}")
    if mol is not None and mol.GetNumAtoms() != X.shape[1]:
        raise ValueError(f"the template has {mol.GetNumAtoms()} atoms but {name} has "
                         f"{X.shape[1]}: add hydrogens or check the atom order")  # fmt: skip
    if not np.isfinite(X).all():
        raise ValueError(f"{name} holds NaN or inf")
    return X


def template_from_smiles(smiles: str) -> Mol:
    """The molecule of ``smiles`` with explicit hydrogens (`Chem.AddHs`), in RDKit's atom
    order (the SMILES order, then the hydrogens); stereo given in the SMILES is kept."""
    Chem, _ = _chem()
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"RDKit cannot parse the SMILES {smiles!r}")
    return Chem.AddHs(mol)


def template_from_molblock(molblock: str) -> Mol:
    """The molecule of a MDL mol block, hydrogens and atom order as written (not removed)."""
    Chem, _ = _chem()
    mol = Chem.MolFromMolBlock(molblock, removeHs=False)
    if mol is None:
        raise ValueError("RDKit cannot parse the mol block")
    return mol


def mmff_energies(mol: Mol, X) -> np.ndarray:
    """MMFF94 energy of each conformer as it is (no optimisation), in kcal/mol.

    One force field is built and evaluated at each conformer's coordinates; its non-bonded
    pair list keeps every pair (cutoff 1e9 Å), so it does not depend on the conformer it was
    built on. Huge energies are returned as they are; RDKit's NaN (coincident atoms) is
    returned as ``+inf``.

    Args:
        mol: template with explicit hydrogens, n atoms.
        X (ArrayLike): conformers in the template's atom order, shape=[N, n, 3] (Å).

    Returns:
        float64, shape=[N].
    """
    Chem, AllChem = _chem()
    X = _clouds(X, "X", mol)
    if any(a.GetTotalNumHs() for a in mol.GetAtoms()):
        raise ValueError("MMFF needs explicit hydrogens: pass Chem.AddHs(mol) (and X with them)")
    m = Chem.Mol(mol)
    m.RemoveAllConformers()
    conf = Chem.Conformer(m.GetNumAtoms())
    m.AddConformer(conf, assignId=True)
    props = AllChem.MMFFGetMoleculeProperties(m)
    if props is None:
        raise ValueError(f"MMFF94 has no atom types for {Chem.MolToSmiles(m)!r}")
    ff = AllChem.MMFFGetMoleculeForceField(m, props, nonBondedThresh=1e9)
    E = np.array([ff.CalcEnergy(x.ravel().tolist()) for x in X])
    return np.where(np.isnan(E), np.inf, E)


def energy_cap(E_ref, margin: float = 100.0) -> float:
    """``max(E_ref) + margin``: the energy `energy_w1_capped` gives broken samples."""
    E_ref = np.asarray(E_ref, dtype=np.float64).ravel()
    if E_ref.size == 0 or not np.isfinite(E_ref).all():
        raise ValueError(f"E_ref must be non-empty and finite, got {E_ref.size} values with "
                         f"{int((~np.isfinite(E_ref)).sum())} non-finite")  # fmt: skip
    return float(E_ref.max() + margin)


def energy_w1_capped(E_samples, E_ref, cap: float | None = None, margin: float = 100.0) -> float:
    """Wasserstein-1 distance (kcal/mol) between sample and reference energies, sample energies
    above ``cap`` (``+inf`` and NaN included) set to ``cap``.

    Dropping non-finite energies would reward a model for breaking molecules, and leaving
    absurd ones (1e6 kcal/mol for two overlapping atoms) in would let one sample decide the
    distance: capped, a broken sample costs ``(cap - E) / N`` like any sample that far off.
    `chemistry_summary` reports how many were capped. The W1 itself is
    `grassflow.metrics.boltzmann.energy_w1` (equal to ``scipy.stats.wasserstein_distance``).

    Args:
        E_samples (ArrayLike): shape=[N].
        E_ref (ArrayLike): finite, shape=[M].
        cap: default `energy_cap` ``(E_ref, margin)``.
        margin: kcal/mol above the highest reference energy, when ``cap`` is None.

    Returns:
        W1 >= 0.
    """
    cap = energy_cap(E_ref, margin) if cap is None else float(cap)
    return energy_w1(_capped(E_samples, cap), np.asarray(E_ref, np.float64))


def _capped(E, cap: float) -> np.ndarray:
    E = np.asarray(E, dtype=np.float64).ravel()
    return np.where(np.isnan(E) | (E > cap), cap, E)


def _neighbour(atom, other: int) -> int | None:
    """The neighbour of ``atom`` other than ``other``: heavy atoms first, then lowest index."""
    nbs = [(a.GetAtomicNum() == 1, a.GetIdx()) for a in atom.GetNeighbors() if a.GetIdx() != other]
    return min(nbs)[1] if nbs else None


def torsion_quads(mol: Mol, heavy: bool = False) -> np.ndarray:
    """One dihedral ``(i, j, k, l)`` per rotatable bond ``j-k``, in bond order.

    Rotatable: single, not in a ring, both ends bonded to another atom, neither end linear
    (sp, whose torsion is undefined). Methyl and hydroxyl rotors count (their hydrogens are
    atoms) unless ``heavy``, which asks both ends for another heavy neighbour. ``i`` and ``l``
    are neighbours of ``j`` and ``k``: heavy atoms first, then the lowest index.

    Returns:
        int64, shape=[T, 4] (T may be 0).
    """
    Chem, _ = _chem()
    quads = []
    for b in mol.GetBonds():
        if b.GetBondType() != Chem.BondType.SINGLE or b.IsInRing():
            continue
        J, K = b.GetBeginAtom(), b.GetEndAtom()
        if Chem.HybridizationType.SP in (J.GetHybridization(), K.GetHybridization()):
            continue
        i, l = _neighbour(J, K.GetIdx()), _neighbour(K, J.GetIdx())
        if i is None or l is None:
            continue
        if heavy and 1 in (mol.GetAtomWithIdx(a).GetAtomicNum() for a in (i, l)):
            continue
        quads.append((i, J.GetIdx(), K.GetIdx(), l))
    return np.array(quads, dtype=np.int64).reshape(-1, 4)


def dihedrals(X, quads) -> np.ndarray:
    """Dihedral angles ``(i, j, k, l)`` in radians on (-pi, pi], IUPAC sign (positive:
    clockwise looking from j to k), ``atan2(|b2| b1 . (b2 x b3), (b1 x b2) . (b2 x b3))``
    with ``b1 = x_j - x_i``, ``b2 = x_k - x_j``, ``b3 = x_l - x_k``.

    Args:
        X (ArrayLike): shape=[N, n, 3].
        quads (ArrayLike): integer atom indices, shape=[T, 4].

    Returns:
        float64, shape=[N, T].
    """
    X = _clouds(X)
    q = np.asarray(quads).reshape(-1, 4)
    inside = len(q) == 0 or (q.min() >= 0 and q.max() < X.shape[1])
    if not np.issubdtype(q.dtype, np.integer) or not inside:
        raise ValueError(f"quads must be (T, 4) integer indices in [0, {X.shape[1]}), got {q}")
    b1, b2, b3 = (X[:, q[:, a + 1]] - X[:, q[:, a]] for a in range(3))
    n1, n2 = np.cross(b1, b2), np.cross(b2, b3)
    y = np.linalg.norm(b2, axis=-1) * (b1 * n2).sum(-1)
    phi = np.arctan2(y, (n1 * n2).sum(-1))
    return np.where(phi <= -np.pi, np.pi, phi)  # atan2(-0., -1) = -pi: the same angle as pi


def _angle_jsd(a: np.ndarray, b: np.ndarray, bins: int) -> np.ndarray:
    """Per-column JSD of angles ``a: (N, T)``, ``b: (M, T)`` binned on (-pi, pi]."""
    h = [[histogram(v[:, t], bins, -np.pi, np.pi) for t in range(v.shape[1])] for v in (a, b)]
    return np.array([jsd(p, q) for p, q in zip(*h)])


def torsion_jsd(X_samples, X_ref, quads, bins: int = 36) -> np.ndarray:
    """Jensen-Shannon divergence (natural log, in [0, ln 2]) of each torsion's histogram.

    ``bins`` equal bins on (-pi, pi] (10 degrees for 36); both histograms are normalised and
    get a pseudocount of 1e-10 per bin (`grassflow.metrics.histograms.jsd`), so empty bins
    stay finite and disjoint histograms give ln 2 to 1e-8.

    Args:
        X_samples (ArrayLike): shape=[N, n, 3].
        X_ref (ArrayLike): shape=[M, n, 3].
        quads (ArrayLike): shape=[T, 4], e.g. `torsion_quads`.
        bins: number of bins, >= 1.

    Returns:
        float64, shape=[T].
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    return _angle_jsd(dihedrals(X_samples, quads), dihedrals(X_ref, quads), bins)


def stereo_elements(mol: Mol) -> list[tuple[str, tuple[int, ...]]]:
    """The potential stereo elements of ``mol`` (RDKit's `FindPotentialStereo`, specified in
    the template or not), each as ``(kind, atoms)``:

    - ``("tetrahedral", (c, a, b, d))``: centre ``c`` and its three lowest-index neighbours;
      its sign is that of the volume ``det[x_a - x_c, x_b - x_c, x_d - x_c]``;
    - ``("double", (i, j, k, l))``: double bond ``j=k`` with neighbours chosen as in
      `torsion_quads`; its sign is +1 for cis (``|phi_ijkl| < pi/2``), -1 for trans.

    Other kinds (atropisomers, allenes, octahedral centres) are not checked.
    """
    Chem, _ = _chem()
    out = []
    for info in Chem.FindPotentialStereo(Chem.Mol(mol)):
        if info.type == Chem.StereoType.Atom_Tetrahedral:
            c = info.centeredOn
            nbs = sorted(a.GetIdx() for a in mol.GetAtomWithIdx(c).GetNeighbors())
            out.append(("tetrahedral", (c, *nbs[:3])))
        elif info.type == Chem.StereoType.Bond_Double:
            b = mol.GetBondWithIdx(info.centeredOn)
            J, K = b.GetBeginAtom(), b.GetEndAtom()
            quad = (_neighbour(J, K.GetIdx()), J.GetIdx(), K.GetIdx(), _neighbour(K, J.GetIdx()))
            out.append(("double", quad))
    return out


def stereo_signature(mol: Mol, X) -> np.ndarray:
    """The sign of each of `stereo_elements` ``(mol)`` in each conformer: ±1, 0 if degenerate
    (planar centre, perpendicular double bond).

    Args:
        mol: template, n atoms.
        X (ArrayLike): shape=[N, n, 3].

    Returns:
        int8, shape=[N, S] (S = 0 without stereo elements).
    """
    X = _clouds(X, "X", mol)
    cols = []
    for kind, atoms in stereo_elements(mol):
        if kind == "tetrahedral":
            c, *abd = atoms
            cols.append(np.sign(np.linalg.det(X[:, abd] - X[:, [c]])))
        else:
            cols.append(np.sign(np.cos(dihedrals(X, [atoms])[:, 0])))
    return np.stack(cols, 1).astype(np.int8) if cols else np.zeros((len(X), 0), np.int8)


def reference_stereo(mol: Mol, X_ref, agreement: float = 0.9) -> np.ndarray:
    """The stereo the reference conformers fix: per element, the majority sign of
    `stereo_signature`, or 0 (not checked) where fewer than ``agreement`` of the conformers
    share it (e.g. a centre the data hold as both enantiomers).

    Returns:
        int8, shape=[S].
    """
    s = stereo_signature(mol, X_ref)
    major = np.where((s > 0).sum(0) >= (s < 0).sum(0), 1, -1).astype(np.int8)
    return np.where((s == major).mean(0) >= agreement, major, 0).astype(np.int8)


def stereo_kept(mol: Mol, X, reference) -> np.ndarray:
    """Whether each conformer has the reference's stereo: every element the reference fixes
    (`reference_stereo`, nonzero) has the same sign. All True without stereo elements.

    Args:
        mol: template, n atoms.
        X (ArrayLike): shape=[N, n, 3].
        reference (ArrayLike): `reference_stereo` of the reference conformers, shape=[S].

    Returns:
        bool, shape=[N].
    """
    s = stereo_signature(mol, X)
    ref = np.asarray(reference).ravel()
    if ref.shape != (s.shape[1],):
        raise ValueError(f"reference must hold the {s.shape[1]} signs of stereo_elements(mol), "
                         f"got shape {ref.shape}")  # fmt: skip
    return ((s == ref) | (ref == 0)).all(1)


def half_split(fn: Callable[[Any, Any], Any], X_ref, seed: int = 0) -> Any:
    """``fn(A, B)`` for two random disjoint halves A, B of ``X_ref`` (rows; the odd one out is
    left out): the value a sample set as good as the reference would get, up to the halved
    sample size. The same ``seed`` gives the same halves for arrays of the same length.

    Args:
        fn: a two-sample metric.
        X_ref (ArrayLike): ndarray or tensor, shape=[M, ...], M >= 2.
        seed: seed of the permutation.
    """
    if len(X_ref) < 2:
        raise ValueError(f"half_split needs at least 2 reference rows, got {len(X_ref)}")
    perm = np.random.default_rng(seed).permutation(len(X_ref))
    h = len(X_ref) // 2
    if hasattr(X_ref, "detach"):
        import torch

        perm = torch.as_tensor(perm, device=X_ref.device)
    return fn(X_ref[perm[:h]], X_ref[perm[h : 2 * h]])


def alanine_dipeptide_phi_psi(mol: Mol) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The backbone dihedrals of alanine dipeptide (``CC(=O)NC(C)C(=O)NC``), found by SMARTS:
    phi = C(=O)-N-CA-C and psi = N-CA-C-N, as atom index quads of ``mol``."""
    Chem, _ = _chem()
    pattern = Chem.MolFromSmarts("[CX3](=O)[NX3][CX4][CX3](=O)[NX3]")
    hits = mol.GetSubstructMatches(pattern)
    if len(hits) != 1:
        raise ValueError(f"expected one alanine dipeptide backbone, found {len(hits)}")
    c0, _, n1, ca, c1, _, n2 = hits[0]
    return (c0, n1, ca, c1), (n1, ca, c1, n2)


def chemistry_summary(mol: Mol, X_samples, X_ref, bonds, *, tol: float = 0.1, clash: float = 0.9,
                      bins: int = 36, margin: float = 100.0, seed: int = 0, E_samples=None,
                      E_ref=None) -> dict[str, Any]:  # fmt: skip
    """Every metric of this module for samples against reference conformers, in one dict.

    Keys (``*_half``: the same metric between two random halves of the reference,
    `half_split` with ``seed``; None where a metric has nothing to measure):

    - ``n_samples``, ``n_reference``;
    - ``bonds_kept``, ``bonds_kept_reference``: `bonds_kept_fraction` with tolerance ``tol``
      around the reference's mean bond lengths (atom order fixed, no matching);
    - ``angle_error``, ``angle_error_reference``: `bond_angle_error` in degrees;
    - ``clash_fraction``: `closest_pair_fraction` below ``clash`` Å;
      ``nonbonded_clash_fraction``: the same over the pairs that are not bonded;
    - ``energy_w1``, ``energy_w1_half``: `energy_w1_capped` (kcal/mol) at ``energy_cap``
      (`energy_cap` with ``margin``); ``n_nonfinite_energy``; ``n_capped_energy`` (above the
      cap, non-finite included); ``energy_median``, ``energy_median_reference``;
    - ``n_torsions``, ``torsion_jsd_mean``, ``torsion_jsd_max``, ``torsion_jsd_half``
      (means over `torsion_quads`, ``bins`` bins);
    - ``n_stereo`` (elements the reference fixes), ``stereo_kept``: fraction of samples.

    Args:
        mol: template with explicit hydrogens, n atoms.
        X_samples (ArrayLike): finite, shape=[N, n, 3].
        X_ref (ArrayLike): finite, shape=[M, n, 3], M >= 2.
        bonds (ArrayLike): shape=[B, 2], e.g. the template's bonds.
        E_samples (ArrayLike | None): MMFF energies of X_samples if already known, shape=[N].
        E_ref (ArrayLike | None): same for X_ref, shape=[M].
    """
    X, R = _clouds(X_samples, "X_samples", mol), _clouds(X_ref, "X_ref", mol)
    E = mmff_energies(mol, X) if E_samples is None else np.asarray(E_samples, np.float64).ravel()
    Er = mmff_energies(mol, R) if E_ref is None else np.asarray(E_ref, np.float64).ravel()
    if E.shape != (len(X),) or Er.shape != (len(R),):
        raise ValueError(f"energies must be ({len(X)},) and ({len(R)},), got {E.shape}, {Er.shape}")
    cap = energy_cap(Er, margin)
    l0 = bond_lengths(R, bonds).mean(0)
    quads = torsion_quads(mol)
    phi, phi_ref = dihedrals(X, quads), dihedrals(R, quads)
    j = _angle_jsd(phi, phi_ref, bins) if len(quads) else None
    j_half = half_split(lambda a, b: _angle_jsd(a, b, bins), phi_ref, seed) if len(quads) else None
    ref = reference_stereo(mol, R)
    return {
        "n_samples": len(X),
        "n_reference": len(R),
        "bonds_kept": bonds_kept_fraction(X, bonds, l0, tol),
        "bonds_kept_reference": bonds_kept_fraction(R, bonds, l0, tol),
        "angle_error": bond_angle_error(X, R, bonds),
        "angle_error_reference": bond_angle_error(R, R, bonds),
        "clash_fraction": closest_pair_fraction(X, clash),
        "nonbonded_clash_fraction": closest_pair_fraction(X, clash, exclude=bonds),
        "energy_w1": energy_w1_capped(E, Er, cap),
        "energy_w1_half": half_split(lambda a, b: energy_w1_capped(a, b, cap), Er, seed),
        "energy_cap": cap,
        "n_nonfinite_energy": int((~np.isfinite(E)).sum()),
        "n_capped_energy": int((~(E <= cap)).sum()),
        "energy_median": float(np.median(_capped(E, cap))),
        "energy_median_reference": float(np.median(Er)),
        "n_torsions": len(quads),
        "torsion_jsd_mean": None if j is None else float(j.mean()),
        "torsion_jsd_max": None if j is None else float(j.max()),
        "torsion_jsd_half": None if j is None else float(j_half.mean()),
        "n_stereo": int((ref != 0).sum()),
        "stereo_kept": float(stereo_kept(mol, X, ref).mean()),
    }
