"""`grassflow.manifolds.zmatrix`: the Z-matrix of a bond graph, checked rule by rule against
graphs and ring perception computed independently by RDKit (its topological distance
matrix, ``Atom.IsInRing``) on butane, glycerol, cyclohexanol and the L-alanine dipeptide with
their hydrogens, plus fused, bridged, spiro and linked ring systems; and around linear
groups (benzonitrile, but-2-yn-1-ol) against RDKit's angles in ETKDG + MMFF conformers; and
the equivalent sibling sides (issue 46: isopropyl, tert-butyl, CF3, nitro, ibuprofen) against
RDKit's symmetry classes of the bare bond graph and the bond list itself."""

import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("rdkit")
from rdkit import Chem  # noqa: E402
from rdkit.Chem import AllChem, rdMolTransforms  # noqa: E402

from grassflow.manifolds.internal import straight_angles  # noqa: E402
from grassflow.manifolds.zmatrix import ZMatrix, build_zmatrix, ring_atoms  # noqa: E402

MOLECULES = {
    "butane": "CCCC",
    "glycerol": "OCC(O)CO",
    "cyclohexanol": "OC1CCCCC1",
    "ala2": "CC(=O)N[C@@H](C)C(=O)NC",
}
RING_SYSTEMS = {
    "naphthalene (fused)": "c1ccc2ccccc2c1",
    "norbornane (bridged)": "C1CC2CCC1C2",
    "spiro[4.4]nonane": "C1CCC2(C1)CCCC2",
    "biphenyl (two rings, a bridge)": "c1ccc(cc1)-c1ccccc1",
    "1,3-diphenylpropane (rings apart)": "c1ccccc1CCCc1ccccc1",
}
LINEAR = {"benzonitrile": "N#Cc1ccccc1", "but-2-yn-1-ol": "CC#CCO"}
# molecules with equivalent sides other than single hydrogens, and the pairs of heavy atoms
# expected among their swaps (besides the geminal hydrogens)
SYMMETRIC = {
    "isopropylbenzene": ("CC(C)c1ccccc1", {(0, 2)}),  # the isopropyl's methyls
    "tert-butanol": ("OC(C)(C)C", {(3, 4)}),  # C2 is a root atom: the pair of the two rows
    "trifluoroethanol": ("OCC(F)(F)F", {(3, 4)}),  # the first two F's of CF3
    "nitromethane": ("C[N+](=O)[O-]", {(2, 3)}),  # N=O and N-O alike (the graph)
    "ibuprofen": ("CC(C)Cc1ccc(cc1)C(C)C(=O)O", {(0, 2)}),  # not the ring, not C(=O)OH
}
# the Z-matrices of MOLECULES before linear groups (commit 81f32b8), by cartesian_rings:
# (root, root_bond, cartesian, rows, swaps), the same for both ring modes but cyclohexanol's
BEFORE = {
    "butane": ((1, 0, 2), 1, (), ((7, 1, 0, 2), (8, 1, 0, 7), (4, 0, 1, 2), (5, 0, 1, 4),
               (6, 0, 1, 5), (3, 2, 1, 0), (9, 2, 1, 3), (10, 2, 1, 9), (11, 3, 2, 1),
               (12, 3, 2, 11), (13, 3, 2, 12)), ((7, 8), (4, 5), (9, 10), (11, 12))),
    "glycerol": ((2, 1, 3), 2, (), ((4, 2, 1, 3), (9, 2, 1, 4), (0, 1, 2, 3), (7, 1, 0, 2),
                 (8, 1, 0, 7), (10, 3, 2, 1), (5, 4, 2, 1), (11, 4, 2, 5), (12, 4, 2, 11),
                 (6, 0, 1, 2), (13, 5, 4, 2)), ((7, 8), (11, 12))),
    "cyclohexanol": ((1, 0, 2), 1, (), ((6, 1, 0, 2), (8, 1, 0, 6), (7, 0, 1, 2), (3, 2, 1, 0),
                     (9, 2, 1, 3), (10, 2, 1, 9), (5, 6, 1, 0), (17, 6, 1, 5), (18, 6, 1, 17),
                     (4, 3, 2, 1), (11, 3, 2, 4), (12, 3, 2, 11), (15, 5, 4, 3),
                     (16, 5, 4, 15), (13, 4, 3, 2), (14, 4, 3, 13)),
                     ((9, 10), (17, 18), (11, 12), (15, 16), (13, 14))),
    "cyclohexanol, ring block": ((1, 2, 6), 1, (3, 5, 4), ((0, 1, 2, 6), (8, 1, 0, 2),
                                 (9, 2, 1, 3), (10, 2, 1, 9), (17, 6, 1, 5), (18, 6, 1, 17),
                                 (7, 0, 1, 2), (11, 3, 2, 4), (12, 3, 2, 11), (15, 5, 4, 6),
                                 (16, 5, 4, 15), (13, 4, 3, 5), (14, 4, 3, 13)),
                                 ((9, 10), (17, 18), (11, 12), (15, 16), (13, 14))),
    "ala2": ((4, 3, 5), 4, (), ((6, 4, 3, 5), (14, 4, 3, 6), (1, 3, 4, 5), (13, 3, 1, 4),
             (15, 5, 4, 3), (16, 5, 4, 15), (17, 5, 4, 16), (7, 6, 4, 3), (8, 6, 4, 7),
             (0, 1, 3, 4), (2, 1, 0, 3), (9, 8, 6, 4), (18, 8, 6, 9), (10, 0, 1, 2),
             (11, 0, 1, 10), (12, 0, 1, 11), (19, 9, 8, 6), (20, 9, 8, 19), (21, 9, 8, 20)),
             ((15, 16), (10, 11), (19, 20))),
}  # fmt: skip


def molecule(smiles: str):
    """``(mol, n, bonds, atomic numbers)`` of ``smiles`` with explicit hydrogens."""
    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()]
    return mol, mol.GetNumAtoms(), bonds, [a.GetAtomicNum() for a in mol.GetAtoms()]


def conformer(smiles: str, seed: int = 0) -> np.ndarray:
    """One RDKit embedding ``(n, 3)`` of ``smiles`` with hydrogens."""
    mol = molecule(smiles)[0]
    assert AllChem.EmbedMolecule(mol, randomSeed=seed) == 0
    return mol.GetConformer().GetPositions()


def minimized(smiles: str, k: int = 24, seed: int = 0):
    """``(mol, x: (k, n, 3))``: ``k`` ETKDG embeddings of ``smiles`` with hydrogens, each
    MMFF94-minimized (kept as mol's conformers)."""
    mol = molecule(smiles)[0]
    assert len(AllChem.EmbedMultipleConfs(mol, numConfs=k, randomSeed=seed)) == k
    AllChem.MMFFOptimizeMoleculeConfs(mol)
    return mol, np.stack([c.GetPositions() for c in mol.GetConformers()])


def graph_classes(mol) -> list[int]:
    """RDKit's symmetry classes (``CanonicalRankAtoms(breakTies=False)``) of ``mol``'s bare
    bond graph: atomic numbers and single bonds, no charges or bond orders."""
    bare = Chem.RWMol()
    for a in mol.GetAtoms():
        atom = Chem.Atom(a.GetAtomicNum())
        atom.SetNoImplicit(True)
        bare.AddAtom(atom)
    for b in mol.GetBonds():
        bare.AddBond(b.GetBeginAtomIdx(), b.GetEndAtomIdx(), Chem.BondType.SINGLE)
    bare = bare.GetMol()
    bare.UpdatePropertyCache(strict=False)
    return list(Chem.CanonicalRankAtoms(bare, breakTies=False))


def side(mol, a: int, j: int) -> set[int]:
    """The atoms nearer to a than to j (for a bond j-a that is a bridge: the side of a)."""
    D = Chem.GetDistanceMatrix(mol)
    return {int(x) for x in np.nonzero(D[:, a] < D[:, j])[0]}


def sibling_groups(zm: ZMatrix, mol) -> dict[int, list[int]]:
    """``{i: group}``: the row atoms with i's bond partner j and i's symmetry class whose bond
    to j is on no ring and whose side holds no ring atom, in row order (RDKit's view of the
    module doc's equivalent siblings)."""
    cls, by_key = graph_classes(mol), {}
    for i, j, _, _ in zm.rows:
        bond = mol.GetBondBetweenAtoms(i, j)  # None in a broken row (the checker sees it)
        if bond is None or bond.IsInRing() or any(
                mol.GetAtomWithIdx(x).IsInRing() for x in side(mol, i, j)):  # fmt: skip
            continue
        by_key.setdefault((j, cls[i]), []).append(i)
    return {i: g for g in by_key.values() if len(g) > 1 for i in g}


def _rows_obey_the_rules(zm: ZMatrix, mol, Z, cartesian_rings: bool = True) -> None:
    """Every rule of the module doc, from RDKit's graph distances, ring perception and
    symmetry classes (independent of the BFS in `build_zmatrix`); references are chosen
    among the atoms off the lines of ``zm.straight`` (collinear triples), and the second of
    a group of equivalent siblings takes its k off both sides."""
    line = {frozenset(t) for t in zm.straight}
    off = lambda *t: frozenset(t) not in line  # noqa: E731
    n = zm.n_atoms
    rings = {a.GetIdx() for a in mol.GetAtoms() if a.IsInRing()} if cartesian_rings else set()
    D = Chem.GetDistanceMatrix(mol).astype(int)
    heavy = [z != 1 for z in Z]
    adj = D == 1
    # every atom placed exactly once
    assert sorted(zm.order) == list(range(n))
    placed = list(zm.root) + list(zm.cartesian)
    d_root = D[list(zm.root)].min(0)  # breadth-first from the root triple
    used: list[tuple[int, int, int]] = []
    groups = sibling_groups(zm, mol)
    for i, j, k, l in zm.rows:
        group = groups.get(i, [i])
        earlier = group[: group.index(i)]  # the equivalent siblings placed before i
        sides = side(mol, earlier[0], j) | side(mol, i, j) if len(earlier) == 1 else set()
        assert len({i, j, k, l}) == 4
        assert adj[i, j], f"row {(i, j, k, l)}: j is not bonded to i"
        assert j in placed and k in placed and l in placed, f"row {(i, j, k, l)} looks ahead"
        assert d_root[i] == d_root[j] + 1, f"row {(i, j, k, l)}: j is not i's BFS parent"
        # k: a placed atom nearest to j off the line i-j, heavy if a heavy one is as near
        assert off(i, j, k), f"row {(i, j, k, l)}: the angle i-j-k is straight"
        pool = [a for a in placed if a != j and off(i, j, a) and a not in sides]
        dk = min(D[j, a] for a in pool)
        if any(heavy[a] and D[j, a] == dk for a in pool):
            assert heavy[k], f"row {(i, j, k, l)}: a hydrogen k where a heavy atom is as near"
        assert k not in sides, f"row {(i, j, k, l)}: k in a swapped side"
        assert D[j, k] == dk, f"row {(i, j, k, l)}: k is not nearest to j"
        # l: a placed atom nearest to k (heavy first), unless that triple is taken; then a
        # sibling of i (bonded to j) where one is free
        assert off(j, k, l), f"row {(i, j, k, l)}: l is on the axis j-k"
        pool = [a for a in placed if a not in (j, k) and off(j, k, a)]
        dl = min(D[k, a] for a in pool)
        best = [a for a in pool if D[k, a] == dl]
        if any(heavy[a] for a in best):
            best = [a for a in best if heavy[a]]
        # an equivalent sibling (a hydrogen) after the first on j (in rows) takes the
        # previous one as reference
        # an atom on a ring atom j: j's other ring neighbour (the side of the ring it is on)
        ring_nb = [a for a in placed if a in rings and adj[a, j] and a != k] if j in rings else []
        ring_nb = [a for a in ring_nb if off(j, k, a)]
        if earlier and (j, k, earlier[-1]) not in used and off(j, k, earlier[-1]):
            assert l == earlier[-1], f"row {(i, j, k, l)}: not the previous hydrogen"
        elif ring_nb and (j, k, ring_nb[0]) not in used:
            assert l == ring_nb[0], f"row {(i, j, k, l)}: not j's other ring neighbour"
        elif l not in best:
            assert any((j, k, b) in used for b in best), f"row {(i, j, k, l)}: l not nearest"
            free = [a for a in pool if adj[a, j] and (j, k, a) not in used]
            if free:
                assert adj[l, j], f"row {(i, j, k, l)}: the fallback l is not a sibling"
        assert (j, k, l) not in used, f"row {(i, j, k, l)}: (j, k, l) taken twice"
        used.append((j, k, l))
        placed.append(i)
    # heavy atoms before hydrogens among the children of one atom
    for j in range(n):
        kids = [heavy[r[0]] for r in zm.rows if r[1] == j]
        assert kids == sorted(kids, reverse=True), f"hydrogens before heavy atoms on {j}"


@pytest.mark.parametrize("cartesian_rings", [True, False])
@pytest.mark.parametrize("name", list(MOLECULES))
def test_zmatrix_rules_on_real_molecules(name, cartesian_rings):
    """Catches an atom placed twice or never, a bond partner j not bonded to i, a reference
    placed after i, a hydrogen reference where a heavy atom is as near, a duplicated (j, k, l)
    and a non-breadth-first parent, on four molecules with hydrogens, with a ring block and
    with implicit ring-closing bonds (the default)."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=cartesian_rings)
    _rows_obey_the_rules(zm, mol, Z, cartesian_rings)
    a0, a1, a2 = zm.root
    # the root frame is a bonded chain: a1 - a0, a2 - root_bond, the angle at root_bond
    assert Z[a0] != 1 and Chem.GetDistanceMatrix(mol)[a0, a1] == 1
    assert Chem.GetDistanceMatrix(mol)[a2, zm.root_bond] == 1
    assert zm.n_internal == 3 * n - 6


def _with_row(zm: ZMatrix, row, mutant) -> ZMatrix:
    """``zm`` with ``row`` replaced by ``mutant``, past ZMatrix's own validation (the rule
    checker must see the broken row)."""
    bad = ZMatrix.__new__(ZMatrix)
    for field, value in zm.to_dict().items():
        object.__setattr__(bad, field, value)
    object.__setattr__(bad, "rows", tuple(mutant if r == row else r for r in zm.rows))
    return bad


@pytest.mark.parametrize("smiles, row, mutant, message", [
    ("CCCC", (9, 2, 1, 3), (9, 2, 1, 0), "taken twice"),  # H9 placed like C3
    ("CCCC", (8, 1, 0, 7), (8, 1, 0, 2), "previous hydrogen"),  # H8 ignores H7 on C1
    ("CCCC", (12, 3, 2, 11), (12, 3, 11, 2), "hydrogen k"),  # H11 where C2 is as near to C3
    ("CCCC", (11, 3, 2, 1), (11, 3, 2, 9), "l not nearest"),  # H9 where C1 is as near to C2
    ("CCCC", (9, 2, 1, 3), (9, 1, 2, 3), "not bonded"),
    ("CCCC", (4, 0, 1, 2), (4, 0, 1, 13), "looks ahead"),
    ("OC1CCCCC1", (0, 1, 2, 6), (0, 1, 2, 3), "other ring neighbour"),  # O0's pucker torsion
])  # fmt: skip
def test_the_rule_checker_has_power(smiles, row, mutant, message):
    """The checker above fails on butane's (and cyclohexanol's) Z-matrix with one row broken
    each way (so the passing tests mean the rules hold)."""
    mol, n, bonds, Z = molecule(smiles)
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    assert row in zm.rows
    bad = _with_row(zm, row, mutant)
    with pytest.raises(AssertionError, match=message):
        _rows_obey_the_rules(bad, mol, Z)


@pytest.mark.parametrize("name", ["butane", "glycerol", "ala2"])
def test_acyclic_root_is_the_most_central_heavy_atom(name):
    """Catches a root chosen by index (long reference chains): without rings a0 has the least
    eccentricity among heavy atoms in RDKit's distance matrix; a1, a2 heavy when they can be."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    D = Chem.GetDistanceMatrix(mol)
    heavy = [a for a in range(n) if Z[a] != 1]
    ecc = D.max(1)
    assert ecc[zm.root[0]] == min(ecc[a] for a in heavy)
    assert all(Z[a] != 1 for a in zm.root)  # these molecules have heavy chains of three
    assert zm.cartesian == ()


@pytest.mark.parametrize("name", list(MOLECULES))
def test_torsion_references_are_not_collinear_in_embedded_conformers(name):
    """Catches a torsion reference l on the line j-k (torsion undefined, NeRF divides by
    zero) and a near-linear angle i-j-k: in RDKit conformers, l is at least 0.3 Å off the
    line j-k and every angle i-j-k is between 15 and 165 degrees."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    for seed in range(3):
        x = conformer(MOLECULES[name], seed)
        for i, j, k, l in zm.rows:
            axis = (x[k] - x[j]) / np.linalg.norm(x[k] - x[j])
            w = x[l] - x[k]
            assert np.linalg.norm(w - (w @ axis) * axis) > 0.3, (i, j, k, l)
            u, v = x[i] - x[j], x[k] - x[j]
            angle = np.degrees(np.arccos(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))
            assert 15 < angle < 165, (i, j, k, l, angle)


def test_two_hydrogens_on_one_carbon_get_different_torsion_references():
    """Catches two hydrogens of one CH2/CH3 placed by the same (j, k, l): each then carries an
    independent torsion and the two can land on each other. Every group of rows with the same
    (j, k) has distinct l, in each molecule; in butane the three methyl hydrogens of C0 use
    (C0, C1) with three different l, H5 about H4 and H6 about H5."""
    for smiles in MOLECULES.values():
        mol, n, bonds, Z = molecule(smiles)
        zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
        groups: dict = {}
        for i, j, k, l in zm.rows:
            groups.setdefault((j, k), []).append((i, l))
        hydrogens_sharing = 0
        for (j, k), members in groups.items():
            ls = [l for _, l in members]
            assert len(set(ls)) == len(ls), (smiles, j, k, members)
            hydrogens_sharing += sum(Z[i] == 1 for i, _ in members) > 1
        assert hydrogens_sharing > 0  # the case arises in each of the four molecules
    mol, n, bonds, Z = molecule("CCCC")  # H4, H5, H6 on C0
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    methyl = [r for r in zm.rows if r[1] == 0]
    assert sorted(r[0] for r in methyl) == [4, 5, 6]
    assert {r[2] for r in methyl} == {1} and len({r[3] for r in methyl}) == 3
    assert [r[3] for r in methyl][1:] == [4, 5]  # each later one about the previous one


@pytest.mark.parametrize("name", list(MOLECULES))
def test_geminal_pairs_are_the_first_two_hydrogens_on_each_atom(name):
    """Catches a swap pair that is not a label symmetry (not two hydrogens on one atom), a
    pair whose second row does not refer to the first (the model then symmetrizes the wrong
    torsion), and a missed CH2/CH3: one pair per atom with two or more hydrogens in rows,
    read off the rows independently; their torsion about each other is the stiff ~120
    degrees in RDKit conformers; ``swaps=False`` lists none and changes no row."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    D = Chem.GetDistanceMatrix(mol)
    terminal_h = {a for a in range(n) if Z[a] == 1 and (D[a] == 1).sum() == 1}
    by_atom: dict = {}
    for i, j, _, _ in zm.rows:
        if i in terminal_h:
            by_atom.setdefault(j, []).append(i)
    want = {(hs[0], hs[1]) for hs in by_atom.values() if len(hs) > 1}
    assert set(zm.swaps) == want and len(zm.swaps) == len(want) > 0
    row_of = {r[0]: r for r in zm.rows}
    for seed in range(2):
        assert AllChem.EmbedMolecule(mol, randomSeed=seed) == 0
        for hs in by_atom.values():  # every later hydrogen about the previous one
            for a, b in zip(hs, hs[1:]):
                i, j, k, l = row_of[b]
                assert l == a
                phi = rdMolTransforms.GetDihedralDeg(mol.GetConformer(), i, j, k, l)
                assert 100 < abs(phi) < 140, (name, row_of[b], phi)
    plain = build_zmatrix(n, bonds, Z, cartesian_rings=True, swaps=False)
    assert plain.swaps == () and plain.rows == zm.rows and plain.cartesian == zm.cartesian
    with pytest.raises(ValueError, match="torsion reference"):
        ZMatrix(zm.n_atoms, zm.root, zm.root_bond, zm.cartesian, zm.rows,
                ((zm.swaps[0][1], zm.swaps[0][0]),))  # fmt: skip


@pytest.mark.parametrize("smiles", ["OC1CCCCC1", *RING_SYSTEMS.values()],
                         ids=["cyclohexanol", *RING_SYSTEMS])  # fmt: skip
def test_ring_atoms_and_only_those_form_the_cartesian_block(smiles):
    """Catches a ring atom left to a Z-matrix row (its ring-closing bond then implicit, rings
    break), a chain atom in the block, and a root frame outside the ring: the block is RDKit's
    ring atoms minus the root, and the root triple lies in a ring; an atom on a ring atom
    takes that atom's other ring neighbour as torsion reference (the checker's rule)."""
    mol, n, bonds, Z = molecule(smiles)
    in_ring = {a.GetIdx() for a in mol.GetAtoms() if a.IsInRing()}
    assert ring_atoms(n, bonds) == in_ring
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    assert set(zm.root) <= in_ring
    assert set(zm.cartesian) == in_ring - set(zm.root)
    assert len(zm.cartesian) == len(set(zm.cartesian))
    assert all(r[0] not in in_ring for r in zm.rows)
    _rows_obey_the_rules(zm, mol, Z)
    # without the block every atom but the root gets a row, by the same rules
    flat = build_zmatrix(n, bonds, Z, cartesian_rings=False)
    assert flat.cartesian == () and len(flat.rows) == n - 3
    _rows_obey_the_rules(flat, mol, Z, cartesian_rings=False)


def test_ring_atoms_of_a_bare_cycle_and_a_tree():
    """Catches a bridge test that marks tree atoms (or misses a cycle's atoms)."""
    assert ring_atoms(5, [(0, 1), (1, 2), (2, 3), (3, 4)]) == set()
    assert ring_atoms(5, [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4)]) == {0, 1, 2}
    assert ring_atoms(4, [(0, 1), (1, 2), (2, 3), (3, 0)]) == {0, 1, 2, 3}


def test_bad_graphs_are_refused_with_a_clear_error():
    """Catches a Z-matrix built from a graph that has none: two molecules in one cloud, fewer
    than three atoms, a bond to an atom that does not exist, a self-bond, a wrong count of
    atomic numbers; and a hand-made `ZMatrix` that places an atom twice or looks ahead."""
    with pytest.raises(ValueError, match=r"not connected.*\[3, 4\]"):
        build_zmatrix(5, [(0, 1), (1, 2), (3, 4)])
    with pytest.raises(ValueError, match="at least 3 atoms, got 2"):
        build_zmatrix(2, [(0, 1)])
    with pytest.raises(ValueError, match=r"bond \(2, 3\).*0\.\.2"):
        build_zmatrix(3, [(0, 1), (1, 2), (2, 3)])
    with pytest.raises(ValueError, match=r"bond \(-1, 0\)"):
        build_zmatrix(3, [(0, 1), (1, 2), (-1, 0)])
    with pytest.raises(ValueError, match=r"bond \(1, 1\)"):
        build_zmatrix(3, [(0, 1), (1, 2), (1, 1)])
    with pytest.raises(ValueError, match="atomic_numbers must have 3"):
        build_zmatrix(3, [(0, 1), (1, 2)], atomic_numbers=[6, 6])
    with pytest.raises(ValueError, match="each of the 4 atoms once"):
        ZMatrix(4, (0, 1, 2), 0, rows=((2, 0, 1, 3),))
    with pytest.raises(ValueError, match="placed before i"):
        ZMatrix(5, (0, 1, 2), 0, rows=((3, 4, 1, 2), (4, 0, 1, 2)))
    with pytest.raises(ValueError, match="root_bond"):
        ZMatrix(3, (0, 1, 2), 2)


def test_zmatrix_survives_a_json_round_trip():
    """Catches a `ZMatrix` that a config cannot carry (JSON turns tuples into lists)."""
    import json

    mol, n, bonds, Z = molecule(MOLECULES["cyclohexanol"])
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=True)
    assert ZMatrix(**json.loads(json.dumps(zm.to_dict()))) == zm


# ------------------------------------------------------------------ linear groups
def _graph(smiles: str):
    mol, n, bonds, Z = molecule(smiles)
    return n, bonds, Z


def _angle(x: np.ndarray, a: int, b: int, c: int) -> np.ndarray:
    """Angles a-b-c in degrees of conformers ``x: (N, n, 3)``, by arccos (not the library's
    atan2)."""
    u, v = x[:, a] - x[:, b], x[:, c] - x[:, b]
    cos = (u * v).sum(-1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)
    return np.degrees(np.arccos(np.clip(cos, -1, 1)))


@pytest.mark.parametrize("cartesian_rings", [False, True])
@pytest.mark.parametrize("name", list(MOLECULES))
def test_molecules_without_linear_groups_keep_their_zmatrix(name, cartesian_rings):
    """Catches a change of the Z-matrix of a molecule without linear groups (the benchmark
    runs, their saved configs and results would then mean another model): the rows, root,
    block and swaps recorded before linear groups, with no ``straight`` and with the straight
    triples of 24 minimized conformers (atoms that happen to line up far apart: none is a
    reference here), whose dict then differs only by the ``straight`` entry, and whose
    printout is the same."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    want = BEFORE[f"{name}, ring block" if cartesian_rings and name == "cyclohexanol" else name]
    plain = build_zmatrix(n, bonds, Z, cartesian_rings=cartesian_rings)
    assert (plain.root, plain.root_bond, plain.cartesian, plain.rows, plain.swaps) == want
    assert "straight" not in plain.to_dict()  # the saved config reads as before
    S = straight_angles(torch.tensor(minimized(MOLECULES[name])[1]), bonds)
    zm = build_zmatrix(n, bonds, Z, cartesian_rings=cartesian_rings, straight=S)
    assert zm.straight == tuple(sorted(S)) and zm.rods == ()
    assert {k: v for k, v in zm.to_dict().items() if k != "straight"} == plain.to_dict()
    assert zm.describe() == plain.describe() and len(plain.describe().splitlines()) == (
        n + 1 + bool(plain.cartesian) - len(plain.cartesian))  # a line per row, the block's


@pytest.mark.parametrize("name", list(LINEAR))
def test_linear_groups_make_no_straight_angle_or_torsion_axis(name):
    """Catches issue 46's refused nitriles and alkynes: a Z-matrix angle i-j-k along the rod
    (torsion undefined, sin theta = 0 in the volume), a torsion reference l on its axis j-k,
    a collinear root, and a rod `straight_angles` misses. In 24 ETKDG + MMFF conformers:
    the bonded straight triples are those RDKit's angles put above 170 degrees (the nitrile
    N-C-C; the alkyne's C-C#C and C#C-C); with them, every root angle, i-j-k and j-k-l is
    within (15, 165) degrees in every conformer (arccos of the coordinates) and the rows obey
    the rules off the lines; the Z-matrix from the graph alone has a straight one (the
    power); benzonitrile's N takes an ortho ring carbon as k, the methyl's first hydrogen of
    but-2-yn-1-ol the O as l."""
    mol, x = minimized(LINEAR[name])
    n, bonds, Z = _graph(LINEAR[name])
    D = Chem.GetDistanceMatrix(mol)
    S = straight_angles(torch.tensor(x), bonds)
    bonded = [(a, b, c) for b in range(n) for a in range(n) for c in range(a + 1, n)
              if D[a, b] == 1 and D[b, c] == 1]  # fmt: skip
    conf = mol.GetConformers()
    rod = {t for t in bonded
           if np.median([rdMolTransforms.GetAngleDeg(c, *t) for c in conf]) > 170}  # fmt: skip
    assert rod == {t for t in S if t in bonded} and rod == (
        {(0, 1, 2)} if name == "benzonitrile" else {(0, 1, 2), (1, 2, 3)})
    zm = build_zmatrix(n, bonds, Z, straight=S)
    _rows_obey_the_rules(zm, mol, Z, cartesian_rings=False)
    a0, a1, a2 = zm.root
    angles = [(a2, zm.root_bond, a1 if zm.root_bond == a0 else a0)]
    angles += [r[:3] for r in zm.rows] + [r[1:] for r in zm.rows]
    for t in angles:
        assert 15 < _angle(x, *t).min() and _angle(x, *t).max() < 165, (t, _angle(x, *t))
    plain = build_zmatrix(n, bonds, Z)
    assert max(_angle(x, *r[:3]).max() for r in plain.rows) > 170
    row = {r[0]: r for r in zm.rows}
    if name == "benzonitrile":  # N0#C1-C2, ring C2..C7
        _, j, k, _ = row[0]
        assert j == 1 and D[k, 2] == 1 and mol.GetAtomWithIdx(k).IsInRing()
    else:  # C0 (methyl: H5, H6, H7) - C1 # C2 - C3 - O4
        assert row[5][3] == 4 and row[6][3] == 5 and row[7][3] == 6
        assert (5, 6) in zm.swaps


@pytest.mark.parametrize("name, row, mutant, message", [
    ("benzonitrile", (0, 1, 3, 2), (0, 1, 2, 3), "the angle i-j-k is straight"),  # N0 on C1-C2
    ("but-2-yn-1-ol", (8, 3, 2, 4), (8, 3, 2, 1), "l is on the axis"),  # H8 about C3-C2 from C1
])  # fmt: skip
def test_the_rule_checker_sees_references_on_a_line(name, row, mutant, message):
    """The checker above fails on a linear group's Z-matrix with a row broken each way (so
    its passing on linear groups means the rules hold off the lines)."""
    mol, x = minimized(LINEAR[name])
    n, bonds, Z = _graph(LINEAR[name])
    zm = build_zmatrix(n, bonds, Z, straight=straight_angles(torch.tensor(x), bonds))
    assert row in zm.rows
    bad = _with_row(zm, row, mutant)
    with pytest.raises(AssertionError, match=message):
        _rows_obey_the_rules(bad, mol, Z, cartesian_rings=False)


def test_describe_names_the_rods_and_how_they_are_referenced():
    """Catches a Z-matrix printout that hides why a row's references are not bonded: the rod
    (with benzonitrile's para C and H in line), and a note on each row that skipped a rod
    atom, naming the straight triple and the reference taken instead."""
    n, bonds, Z = _graph(LINEAR["benzonitrile"])
    zm = build_zmatrix(n, bonds, Z, straight=straight_angles(
        torch.tensor(minimized(LINEAR["benzonitrile"])[1]), bonds))  # fmt: skip
    text = zm.describe(["N", *"CCCCCCC", *"HHHHH"])
    assert zm.rods == ((0, 1, 2, 5, 10),)
    assert "on a straight line in the data (no angle or torsion axis along it): N0 C1 C2 C5 H10" \
        in text  # fmt: skip
    k = {r[0]: r for r in zm.rows}[0][2]
    assert f"N0: bond C1, angle C{k}, torsion" in text
    assert f"(linear: N0-C1-C2 straight, so the angle is to C{k})" in text
    assert sum("(linear:" in line for line in text.splitlines()) == 2  # N0's and C7's rows
    plain = build_zmatrix(n, bonds, Z).describe()
    assert "straight" not in plain and "linear" not in plain


@pytest.mark.parametrize("smiles", ["C#C", "O=C=O", "N#CC#N"])
def test_a_linear_molecule_is_refused_with_a_clear_error(smiles):
    """Catches a linear molecule given a Z-matrix anyway (every angle straight: no frame, no
    density): its straight triples (from minimized conformers) leave no bent root."""
    mol, x = minimized(smiles, k=4)
    n, bonds, Z = _graph(smiles)
    with pytest.raises(ValueError, match=r"linear molecule .*--geometry cartesian"):
        build_zmatrix(n, bonds, Z, straight=straight_angles(torch.tensor(x), bonds))


def test_a_zmatrix_that_contradicts_its_straight_triples_is_refused():
    """Catches a hand-made (or edited) Z-matrix with a straight angle, torsion axis or root
    among its own ``straight`` triples, and malformed triples; a JSON round trip keeps the
    triples (a resumed run rebuilds the same Z-matrix)."""
    n, bonds, Z = _graph(LINEAR["but-2-yn-1-ol"])
    S = straight_angles(torch.tensor(minimized(LINEAR["but-2-yn-1-ol"])[1]), bonds)
    zm = build_zmatrix(n, bonds, Z, straight=S)
    assert ZMatrix(**json.loads(json.dumps(zm.to_dict()))) == zm and zm.straight
    with pytest.raises(ValueError, match=r"root angle 3-2-1 is straight"):  # C3-C2#C1
        ZMatrix(**{**build_zmatrix(n, bonds, Z).to_dict(), "straight": S})
    for row, mutant, message in [((1, 2, 4, 3), (1, 2, 3, 4), r"its angle 1-2-3 is straight"),
                                 ((5, 0, 1, 4), (5, 0, 1, 2), r"its torsion axis and "
                                  r"reference 0-1-2 is straight")]:  # fmt: skip
        assert row in zm.rows
        rows = tuple(mutant if r == row else r for r in zm.rows)
        with pytest.raises(ValueError, match=re.escape(f"row {mutant}: ") + message):
            ZMatrix(**{**zm.to_dict(), "rows": rows})
    with pytest.raises(ValueError, match=r"straight triple \(1, 1, 2\)"):
        ZMatrix(**{**zm.to_dict(), "straight": ((1, 1, 2),)})


# ------------------------------------------------------------------ equivalent sides
@pytest.mark.parametrize("name", list(SYMMETRIC))
def test_equivalent_sides_are_found_and_swapped_by_a_graph_automorphism(name):
    """Catches a missed symmetry of the molecular graph (issue 46: ibuprofen's isobutyl
    methyls, whose labellings the data mix), a swap that is not one (a permutation that
    breaks a bond, moves an atom to another element, moves the torsion's axis j-k, or swaps
    a <-> b without their hydrogens), and a ring or C(=O)OH taken as symmetric: the pairs
    are the first two row atoms of each group of RDKit's symmetry classes on j (bare graph;
    bonds off rings, sides without ring atoms), listed in placement order of b; each
    permutation maps the bond list onto itself and every atom to one of its class, fixes j
    and k, is an involution, and maps a's side (atoms nearer a than j) onto b's; the heavy
    pairs are the expected ones; the rows obey the rules."""
    smiles, heavy_pairs = SYMMETRIC[name]
    mol, n, bonds, Z = molecule(smiles)
    zm = build_zmatrix(n, bonds, Z)
    _rows_obey_the_rules(zm, mol, Z, cartesian_rings=False)
    groups = sibling_groups(zm, mol)
    want = {(g[0], g[1]) for g in groups.values()}
    assert set(zm.swaps) == want
    place = {a: m for m, a in enumerate(zm.order)}
    assert [place[b] for _, b in zm.swaps] == sorted(place[b] for _, b in zm.swaps)
    assert {(a, b) for a, b in zm.swaps if Z[a] != 1} == heavy_pairs
    cls, bond_set = graph_classes(mol), {frozenset(b) for b in bonds}
    row = {r[0]: r for r in zm.rows}
    for m, (a, b) in enumerate(zm.swaps):
        sigma = zm.swap_permutation(m)
        assert {frozenset((sigma[u], sigma[v])) for u, v in bonds} == bond_set
        assert all(cls[sigma[u]] == cls[u] for u in range(n))
        assert [sigma[sigma[u]] for u in range(n)] == list(range(n))
        _, j, k, l = row[b]
        assert l == a and sigma[a] == b and sigma[j] == j and sigma[k] == k
        A, B = zm.swap_sides[m]
        assert set(A) == side(mol, a, j) and set(B) == side(mol, b, j)
        assert {sigma[u] for u in A} == set(B)
    if name == "isopropylbenzene":  # the methyls C0 (H9, H10, H11) and C2 (H13, H14, H15)
        assert zm.swap_sides[zm.swaps.index((0, 2))] == ((0, 9, 10, 11), (2, 13, 14, 15))


def test_siblings_in_the_root_frame_are_not_swapped():
    """Documents the limit of the module doc: tert-butanol written CC(C)(C)O puts two of its
    methyls in the root frame, so only the third is a row and no methyl pair is swapped (only
    the geminal hydrogens); written OC(C)(C)C it gets one (the test above)."""
    mol, n, bonds, Z = molecule("CC(C)(C)O")
    zm = build_zmatrix(n, bonds, Z)
    assert zm.root[1:] == (0, 2) and all(Z[a] == 1 for a, _ in zm.swaps)


@pytest.mark.parametrize("name", list(MOLECULES))
def test_benchmark_molecules_keep_their_zmatrix_and_config_with_equivalent_sides(name):
    """Catches a change of the benchmark molecules' models by the equivalent-sides rule: the
    Z-matrix with ``sides=True`` (the default) is the recorded one and equal to
    ``sides=False`` (the rule before issue 46), its swaps are single atoms and ``swap_sides``
    is left out of its dict, so an old config (without it) loads equal."""
    mol, n, bonds, Z = molecule(MOLECULES[name])
    for cartesian_rings in (False, True):
        zm = build_zmatrix(n, bonds, Z, cartesian_rings=cartesian_rings)
        key = f"{name}, ring block" if cartesian_rings and name == "cyclohexanol" else name
        assert (zm.root, zm.root_bond, zm.cartesian, zm.rows, zm.swaps) == BEFORE[key]
        assert zm == build_zmatrix(n, bonds, Z, cartesian_rings=cartesian_rings, sides=False)
        assert zm.swap_sides == tuple(((a,), (b,)) for a, b in zm.swaps)
        d = zm.to_dict()
        assert "swap_sides" not in d and ZMatrix(**json.loads(json.dumps(d))) == zm


def test_sides_false_is_the_rule_before_issue_46():
    """Catches a switch that does not restore the old rule (the comparison runs need it):
    ibuprofen with ``sides=False`` swaps terminal hydrogens only, its methyl C2 takes no
    sibling as torsion reference, and its dict has no ``swap_sides``; with the default the
    isobutyl's methyls are swapped with their hydrogens and the dict keeps the sides through
    JSON."""
    mol, n, bonds, Z = molecule(SYMMETRIC["ibuprofen"][0])
    old = build_zmatrix(n, bonds, Z, sides=False)
    new = build_zmatrix(n, bonds, Z)
    assert all(Z[a] == 1 for a, _ in old.swaps) and "swap_sides" not in old.to_dict()
    assert {r[0]: r for r in old.rows}[2][3] != 0 and {r[0]: r for r in new.rows}[2][3] == 0
    assert set(new.swaps) == set(old.swaps) | {(0, 2)}
    assert ZMatrix(**json.loads(json.dumps(new.to_dict()))) == new


def test_describe_names_the_swapped_sides():
    """Catches a printout that hides which rows are symmetrized and what a swap moves: the
    isopropyl's second methyl row names the two sides; geminal pairs keep their note."""
    mol, n, bonds, Z = molecule(SYMMETRIC["isopropylbenzene"][0])
    text = build_zmatrix(n, bonds, Z).describe([a.GetSymbol() for a in mol.GetAtoms()])
    assert ("C2: bond C1, angle C3, torsion C0 (in (0, 180): equivalent to C0, symmetrized by "
            "swapping the sides C0 H9 H10 H11 <-> C2 H13 H14 H15)") in text
    assert sum("geminal pair, symmetrized" in line for line in text.splitlines()) == 2
