"""`grassflow.manifolds.zmatrix`: the Z-matrix of a bond graph, checked rule by rule against
graphs and ring perception computed independently by RDKit (its topological distance
matrix, ``Atom.IsInRing``) on butane, glycerol, cyclohexanol and the L-alanine dipeptide with
their hydrogens, plus fused, bridged, spiro and linked ring systems."""

import numpy as np
import pytest

pytest.importorskip("rdkit")
from rdkit import Chem  # noqa: E402
from rdkit.Chem import AllChem, rdMolTransforms  # noqa: E402

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


def _rows_obey_the_rules(zm: ZMatrix, mol, Z, cartesian_rings: bool = True) -> None:
    """Every rule of the module doc, from RDKit's graph distances and ring perception
    (independent of the BFS in `build_zmatrix`)."""
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
    for i, j, k, l in zm.rows:
        assert len({i, j, k, l}) == 4
        assert adj[i, j], f"row {(i, j, k, l)}: j is not bonded to i"
        assert j in placed and k in placed and l in placed, f"row {(i, j, k, l)} looks ahead"
        assert d_root[i] == d_root[j] + 1, f"row {(i, j, k, l)}: j is not i's BFS parent"
        # k: a placed atom nearest to j, heavy if a heavy one is as near
        pool = [a for a in placed if a != j]
        dk = min(D[j, a] for a in pool)
        assert D[j, k] == dk, f"row {(i, j, k, l)}: k is not nearest to j"
        if any(heavy[a] and D[j, a] == dk for a in pool):
            assert heavy[k], f"row {(i, j, k, l)}: a hydrogen k where a heavy atom is as near"
        # l: a placed atom nearest to k (heavy first), unless that triple is taken; then a
        # sibling of i (bonded to j) where one is free
        pool = [a for a in placed if a not in (j, k)]
        dl = min(D[k, a] for a in pool)
        best = [a for a in pool if D[k, a] == dl]
        if any(heavy[a] for a in best):
            best = [a for a in best if heavy[a]]
        # a hydrogen after the first on j (in rows) takes the previous one as reference
        earlier = [r[0] for r in zm.rows[:zm.rows.index((i, j, k, l))]
                   if r[1] == j and Z[r[0]] == 1 and adj[r[0]].sum() == 1]  # fmt: skip
        # an atom on a ring atom j: j's other ring neighbour (the side of the ring it is on)
        ring_nb = [a for a in placed if a in rings and adj[a, j] and a != k] if j in rings else []
        if Z[i] == 1 and adj[i].sum() == 1 and earlier and (j, k, earlier[-1]) not in used:
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
    bad = ZMatrix.__new__(ZMatrix)  # skip ZMatrix's own validation: the checker must see it
    for field, value in zm.to_dict().items():
        object.__setattr__(bad, field, value)
    object.__setattr__(bad, "rows", tuple(mutant if r == row else r for r in zm.rows))
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
