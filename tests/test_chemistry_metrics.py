"""grassflow.metrics.chemistry and grassflow.viz.conformer_plots, checked against RDKit and
scipy computed independently."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import wasserstein_distance

pytest.importorskip("rdkit")
from rdkit import Chem  # noqa: E402
from rdkit.Chem import AllChem  # noqa: E402
from rdkit.Chem import rdMolTransforms as T  # noqa: E402

from grassflow.metrics import chemistry as ch  # noqa: E402
from grassflow.viz import plot_conformer_energies, plot_ramachandran, plot_torsions  # noqa: E402

MIRROR = np.array([-1.0, 1.0, 1.0])
ALA2 = "CC(=O)NC(C)C(=O)NC"


def _confs(smiles: str, n: int, seed: int = 7):
    mol = ch.template_from_smiles(smiles)
    cids = list(AllChem.EmbedMultipleConfs(mol, n, randomSeed=seed))
    assert len(cids) == n
    return mol, np.stack([mol.GetConformer(c).GetPositions() for c in cids])


def _bonds(mol) -> np.ndarray:
    return np.array([(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds()])


def _side(mol, j: int, k: int) -> list[int]:
    """Atoms reachable from k without crossing the bond j-k (k included)."""
    side, stack = {k}, [k]
    while stack:
        for nb in mol.GetAtomWithIdx(stack.pop()).GetNeighbors():
            if nb.GetIdx() not in side and nb.GetIdx() != j:
                side.add(nb.GetIdx())
                stack.append(nb.GetIdx())
    return sorted(side)


def _rotate(x: np.ndarray, j: int, k: int, side, angle: float) -> np.ndarray:
    u = (x[k] - x[j]) / np.linalg.norm(x[k] - x[j])
    p = x[side] - x[k]
    y = x.copy()
    y[side] = (x[k] + p * math.cos(angle) + np.cross(u, p) * math.sin(angle)
               + np.outer(p @ u, u) * (1 - math.cos(angle)))  # fmt: skip
    return y


@pytest.fixture(scope="module")
def ala2():
    return _confs(ALA2, 40)


def test_dihedrals_match_rdkit_and_flip_sign_in_the_mirror(ala2):
    # catches a wrong sign convention, a swapped atom in the atan2 formula, or a range off by 2 pi
    mol, X = ala2
    quads = ch.torsion_quads(mol)
    phi = ch.dihedrals(X, quads)
    ref = np.array([[T.GetDihedralRad(mol.GetConformer(c), *map(int, q)) for q in quads]
                    for c in range(len(X))])  # fmt: skip
    assert phi.shape == (len(X), len(quads)) == ref.shape
    assert np.abs(np.angle(np.exp(1j * (phi - ref)))).max() < 1e-9
    assert (phi > -np.pi).all() and (phi <= np.pi).all()
    np.testing.assert_allclose(ch.dihedrals(X * MIRROR, quads), -phi, atol=1e-9)
    np.testing.assert_allclose(ch.dihedrals(torch.tensor(X), quads), phi)  # tensors too


def test_torsion_quads_are_rotatable_bonds_with_heavy_neighbours_first():
    # catches ring, double or terminal bonds counted as rotatable, or a hydrogen picked for i/l
    mol = ch.template_from_smiles("CC(C)c1ccccc1C=CCO")
    reverse = Chem.RenumberAtoms(mol, list(range(mol.GetNumAtoms()))[::-1])  # hydrogens first
    for m in (mol, reverse):
        for i, j, k, l in ch.torsion_quads(m).tolist():
            b = m.GetBondBetweenAtoms(j, k)
            assert b.GetBondType() == Chem.BondType.SINGLE and not b.IsInRing()
            assert m.GetBondBetweenAtoms(i, j) and m.GetBondBetweenAtoms(k, l)
            for end, other in ((j, i), (k, l)):  # a hydrogen only when no heavy one is left
                heavy = [a.GetAtomicNum() > 1 for a in m.GetAtomWithIdx(end).GetNeighbors()]
                assert m.GetAtomWithIdx(other).GetAtomicNum() > 1 or sum(heavy) == 1
    assert len(ch.torsion_quads(mol, heavy=True)) == 3  # iPr-ring, ring-C=, =C-CH2: not CH3, OH
    assert ch.torsion_quads(ch.template_from_smiles("C1CC1")).shape == (0, 4)
    assert ch.torsion_quads(ch.template_from_smiles("CC#CC")).shape == (0, 4)  # linear ends


def test_mmff_energies_match_rdkit_force_fields_and_rise_with_a_stretched_bond(ala2):
    # catches a force field left at its build conformer, positions misordered, or wrong units
    mol, X = ala2
    E = ch.mmff_energies(mol, X[:5])
    props = AllChem.MMFFGetMoleculeProperties(mol)
    ref = [AllChem.MMFFGetMoleculeForceField(mol, props, confId=c).CalcEnergy() for c in range(5)]
    np.testing.assert_allclose(E, ref, rtol=1e-10, atol=1e-8)
    Y = X[:1].copy()
    side = _side(mol, 1, 2)  # the carbonyl oxygen pulled out along C=O
    Y[0, side] += 0.3 * (Y[0, 2] - Y[0, 1]) / np.linalg.norm(Y[0, 2] - Y[0, 1])
    assert ch.mmff_energies(mol, Y)[0] > E[0] + 10
    Y[0, 3] = Y[0, 4]  # coincident atoms: RDKit's NaN comes back as +inf
    assert ch.mmff_energies(mol, Y)[0] == np.inf
    with pytest.raises(ValueError, match="atoms"):
        ch.mmff_energies(mol, X[:, :-1])
    with pytest.raises(ValueError, match="hydrogens"):
        ch.mmff_energies(Chem.MolFromSmiles(ALA2), X[:, :12])


def test_molblock_template_keeps_the_atom_order(ala2):
    # catches hydrogens removed or atoms reordered when reading a mol block
    mol, X = ala2
    t = ch.template_from_molblock(Chem.MolToMolBlock(mol, confId=0))
    assert [a.GetAtomicNum() for a in t.GetAtoms()] == [a.GetAtomicNum() for a in mol.GetAtoms()]
    np.testing.assert_allclose(ch.mmff_energies(t, X[:3]), ch.mmff_energies(mol, X[:3]))


def test_capped_energy_w1_is_scipys_w1_with_broken_samples_at_the_cap():
    # catches infinite energies dropped (rewarding broken samples) or the cap applied to finite ones
    rng = np.random.default_rng(0)
    E_ref, E = rng.normal(size=50), rng.normal(0.5, 1, size=40)
    assert ch.energy_w1_capped(E, E_ref) == pytest.approx(wasserstein_distance(E, E_ref))
    broken = np.concatenate([E, [np.inf, np.nan, 1e9]])
    cap = ch.energy_cap(E_ref, 100.0)
    expected = wasserstein_distance(np.concatenate([E, [cap] * 3]), E_ref)
    assert ch.energy_w1_capped(broken, E_ref) == pytest.approx(expected)
    with pytest.raises(ValueError, match="finite"):
        ch.energy_cap([0.0, np.inf])


def _chain(phi: np.ndarray) -> np.ndarray:
    """(N, 4, 3) four-atom chains with torsion angles ``phi``."""
    X = np.zeros((len(phi), 4, 3))
    X[:, 0] = [1, 0, 0]
    X[:, 2] = [0, 0, 1.5]
    X[:, 3] = np.stack([np.cos(phi), np.sin(phi), np.full_like(phi, 1.5)], 1)
    return X


def test_dihedral_range_excludes_minus_pi():
    # catches atan2's -pi (rounded from just below -pi + 1e-16) outside the range (-pi, pi]
    X = _chain(np.array([np.pi]))
    X[0, 3] = [-1.0, -1e-300, 1.5]
    assert ch.dihedrals(X, [[0, 1, 2, 3]])[0, 0] == np.pi


def test_torsion_jsd_zero_ln2_symmetric_and_equal_to_scipy():
    # catches a log base other than e, unnormalised histograms, or an asymmetric divergence
    rng = np.random.default_rng(1)
    q = [[0, 1, 2, 3]]
    A, B = _chain(rng.uniform(-3, 3, 300)), _chain(rng.normal(1, 0.7, 200))
    assert ch.torsion_jsd(A, A, q)[0] == pytest.approx(0, abs=1e-12)
    disjoint = ch.torsion_jsd(_chain(rng.uniform(0.1, 0.5, 50)), _chain(rng.uniform(2, 2.5, 50)), q)
    assert disjoint[0] == pytest.approx(math.log(2), abs=1e-6)
    assert ch.torsion_jsd(A, B, q)[0] == pytest.approx(ch.torsion_jsd(B, A, q)[0], abs=1e-15)
    edges = np.linspace(-np.pi, np.pi, 37)
    p, r = (np.histogram(ch.dihedrals(Z, q)[:, 0], edges)[0] for Z in (A, B))
    assert ch.torsion_jsd(A, B, q)[0] == pytest.approx(jensenshannon(p, r) ** 2, rel=1e-6)


def _cip(mol, x) -> str:
    m = Chem.Mol(mol)
    m.RemoveAllConformers()
    conf = Chem.Conformer(m.GetNumAtoms())
    for a, p in enumerate(x):
        conf.SetAtomPosition(a, p.tolist())
    m.AddConformer(conf)
    Chem.AssignStereochemistryFrom3D(m)
    return Chem.FindMolChiralCenters(m)[0][1]


def test_stereo_of_2_butanol_agrees_with_rdkit_cip_and_the_mirror_fails():
    # catches a chirality sign that ignores the geometry or a reference taken from one outlier
    mol, X = _confs("C[C@H](O)CC", 12)
    ref = ch.reference_stereo(mol, X)
    assert ref.shape == (1,) and ref[0] != 0
    mixed = np.concatenate([X[:6], X[6:] * MIRROR])
    kept = ch.stereo_kept(mol, mixed, ref)
    np.testing.assert_array_equal(kept, [True] * 6 + [False] * 6)
    cip = [_cip(mol, x) for x in mixed]
    np.testing.assert_array_equal(kept, [c == cip[0] for c in cip])
    np.testing.assert_array_equal(ch.reference_stereo(mol, mixed), [0])  # not fixed: not checked
    assert ch.stereo_kept(mol, mixed, [0]).all()
    with pytest.raises(ValueError, match="signs"):
        ch.stereo_kept(mol, X, [1, 1])


def test_stereo_of_2_butene_flips_when_rotated_about_the_double_bond():
    # catches E/Z read from the wrong neighbours or not read from 3-D at all
    mol, X = _confs("C/C=C/C", 4)
    (kind, (i, j, k, l)), = ch.stereo_elements(mol)  # fmt: skip
    assert kind == "double" and mol.GetBondBetweenAtoms(j, k).GetBondType() == Chem.BondType.DOUBLE
    np.testing.assert_array_equal(ch.reference_stereo(mol, X), [-1])  # trans: heavy i, l
    flipped = np.stack([_rotate(x, j, k, _side(mol, j, k), math.pi) for x in X])
    ref = ch.reference_stereo(mol, X)
    assert ch.stereo_kept(mol, X, ref).all() and not ch.stereo_kept(mol, flipped, ref).any()


def test_no_stereo_means_every_sample_keeps_it():
    # catches an empty signature treated as a failure (all() of nothing is True)
    mol, X = _confs("CCCC", 3)
    s = ch.stereo_signature(mol, X)
    assert s.shape == (3, 0)
    assert ch.stereo_kept(mol, X * MIRROR, ch.reference_stereo(mol, X)).all()


def test_half_split_is_small_against_a_different_set_and_reproducible():
    # catches overlapping halves (value 0), an unseeded split, or tensors refused
    rng = np.random.default_rng(2)
    ref, other = rng.normal(size=(400, 3)), rng.normal(1, 1, size=(200, 3))
    fn = ch.energy_w1_capped
    half = ch.half_split(lambda a, b: fn(a[:, 0], b[:, 0]), ref, seed=3)
    assert 0 < half < 0.3 * fn(other[:, 0], ref[:, 0])
    assert half == ch.half_split(lambda a, b: fn(a[:, 0], b[:, 0]), ref, seed=3)
    seen = ch.half_split(lambda a, b: np.concatenate([a, b])[:, 0], ref[:5])
    assert len(set(seen)) == 4 and set(seen) <= set(ref[:5, 0])
    t = ch.half_split(lambda a, b: (a.shape, type(a)), torch.tensor(ref))
    assert t == ((200, 3), torch.Tensor)


def test_alanine_dipeptide_phi_psi_are_the_backbone_atoms(ala2):
    # catches the SMARTS matching the acetyl or N-methyl end, or the atoms of a quad out of order
    mol, _ = ala2
    phi, psi = ch.alanine_dipeptide_phi_psi(mol)
    el = lambda q: [mol.GetAtomWithIdx(a).GetSymbol() for a in q]  # noqa: E731
    assert el(phi) == ["C", "N", "C", "C"] and el(psi) == ["N", "C", "C", "N"]
    assert phi[1:] == psi[:3]
    for q in (phi, psi):
        assert all(mol.GetBondBetweenAtoms(a, b) for a, b in zip(q, q[1:]))
    ca = mol.GetAtomWithIdx(phi[2])
    assert sorted(a.GetSymbol() for a in ca.GetNeighbors()) == ["C", "C", "H", "N"]
    carbonyl = lambda a: any(n.GetSymbol() == "O" for n in mol.GetAtomWithIdx(a).GetNeighbors())  # noqa: E731
    assert carbonyl(phi[0]) and carbonyl(phi[3])  # both C(=O), the N-methyl carbon is not
    with pytest.raises(ValueError, match="backbone"):
        ch.alanine_dipeptide_phi_psi(ch.template_from_smiles("CCO"))


def test_chemistry_summary_counts_mirrors_and_broken_samples():
    # catches a summary that drops broken samples or compares samples with themselves
    mol, X = _confs("C[C@H](O)CC", 16, seed=3)
    samples = np.concatenate([X[:4], X[4:8] * MIRROR])
    samples[0, 1] = samples[0, 0] + 0.1  # a clash, a broken bond, a huge energy
    s = ch.chemistry_summary(mol, samples, X[8:], _bonds(mol))
    assert s["n_samples"] == 8 and s["n_reference"] == 8
    assert s["stereo_kept"] == pytest.approx(3 / 8) and s["n_stereo"] == 1
    assert s["clash_fraction"] == pytest.approx(1 / 8) and s["bonds_kept"] == pytest.approx(7 / 8)
    # the clash is a bond squeezed to 0.1 Å, not two unbonded atoms: no steric clash
    assert s["nonbonded_clash_fraction"] == 0.0
    assert s["bonds_kept_reference"] == 1.0 and s["n_capped_energy"] == 1
    assert s["energy_w1"] > s["energy_w1_half"] >= 0
    assert s["n_torsions"] == len(ch.torsion_quads(mol))
    assert 0 <= s["torsion_jsd_half"] and 0 <= s["torsion_jsd_mean"] <= math.log(2)
    with pytest.raises(ValueError, match="atoms"):
        ch.chemistry_summary(mol, samples[:, :-1], X[8:], _bonds(mol))


def _png(path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_write_png_files(ala2, tmp_path):
    # catches a plot that raises on non-finite energies or writes nothing
    mol, X = ala2
    E = ch.mmff_energies(mol, X)
    broken = np.concatenate([E[:20], [np.inf, 1e9]])
    assert _png(plot_conformer_energies(broken, E[20:], tmp_path / "e" / "energies.png"))
    assert _png(plot_torsions(X[:20], X[20:], ch.torsion_quads(mol)[:5], tmp_path / "t.png"))
    pp = ch.dihedrals(X, ch.alanine_dipeptide_phi_psi(mol))
    assert _png(plot_ramachandran(pp[:20], pp[20:], tmp_path / "rama.png"))
    with pytest.raises(ValueError, match="empty"):
        plot_torsions(X, X, np.zeros((0, 4), int), tmp_path / "none.png")


def test_bond_angles_of_methane_and_their_error():
    # bug caught: a vertex's pair missed or counted twice, the angle taken at the wrong atom,
    # radians for degrees, an error against another reference than the mean angles
    from grassflow.metrics import angle_triples, bond_angle_error, bond_angles

    H = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]]) * 0.63
    X = np.concatenate([np.zeros((1, 3)), H])[None]
    bonds = np.array([[0, 1], [0, 2], [0, 3], [0, 4]])
    t = angle_triples(bonds, 5)
    assert t.tolist() == [[i, 0, k] for i in range(1, 5) for k in range(i + 1, 5)]
    np.testing.assert_allclose(bond_angles(X, bonds), np.degrees(np.arccos(-1 / 3)), atol=1e-12)
    Y = X.copy()
    Y[0, 1] = [0.0, 0.0, 1.2]  # one H moved: three angles change
    u, v = Y[0, t[:, 0]], Y[0, t[:, 2]]  # the vertex is at the origin
    independent = np.degrees(np.arctan2(np.linalg.norm(np.cross(u, v), axis=-1), (u * v).sum(-1)))
    np.testing.assert_allclose(bond_angles(Y, bonds)[0], independent, atol=1e-10)
    ref = np.concatenate([X, X])
    expected = np.abs(independent - np.degrees(np.arccos(-1 / 3))).mean()
    assert bond_angle_error(Y, ref, bonds) == pytest.approx(expected, rel=1e-12)
    assert bond_angle_error(ref, ref, bonds) == pytest.approx(0.0, abs=1e-9)
