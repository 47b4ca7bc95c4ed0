"""Thermal conformer ensembles (grassflow.data.conformers): graph, thermal spread, caching."""

import sys

import numpy as np
import pytest

from grassflow.data import conformers
from grassflow.data.point_clouds import load_point_clouds

SMALL = {"n_chains": 4, "burn_in": 300, "thin": 10}  # ethanol, 9 atoms: well under a second


@pytest.fixture(scope="module")
def ethanol():
    pytest.importorskip("rdkit")
    return conformers.conformer_ensemble("CCO", 200, seed=0, **SMALL)


def test_missing_rdkit_names_the_extra(monkeypatch):
    # bug caught: a bare ModuleNotFoundError that does not say how to install the extra
    monkeypatch.setitem(sys.modules, "rdkit", None)
    with pytest.raises(ImportError, match=r"grassflow\[molecules\]"):
        conformers.conformer_ensemble("CCO", 4)


def test_same_seed_same_ensemble_other_seed_other(ethanol):
    # bug caught: randomness from a global generator (RDKit's or numpy's) instead of the seed
    again = conformers.conformer_ensemble("CCO", 200, seed=0, **SMALL)
    np.testing.assert_array_equal(again.positions, ethanol.positions)
    other = conformers.conformer_ensemble("CCO", 200, seed=1, **SMALL)
    assert np.abs(other.positions - ethanol.positions).max() > 0.1


def test_labels_and_bonds_are_the_molecule_with_explicit_hydrogens(ethanol):
    # bug caught: hydrogens left implicit, labels not atomic numbers, bonds of another order
    from rdkit import Chem

    mol = Chem.AddHs(Chem.MolFromSmiles("CCO"))
    Z = [a.GetAtomicNum() for a in mol.GetAtoms()]
    assert ethanol.positions.shape == (200, 9, 3) and ethanol.labels.shape == (200, 9)
    assert (ethanol.labels == Z).all() and sorted(Z) == [1] * 6 + [6, 6, 8]
    graph = {tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in mol.GetBonds()}
    assert set(map(tuple, ethanol.bonds.tolist())) == graph and len(ethanol.bonds) == 8
    assert ethanol.smiles == "CCO" and len(ethanol.sources) == 200


def test_bonds_fluctuate_thermally_about_the_mmff_minimum(ethanol):
    # bug caught: states frozen at minima (no spread), a wrong kT (kJ for kcal: spread off by
    # 2x; a missing 1/kT: far off) or a sampler that drifts off the bonded geometry. The C-H
    # stretch spread is compared with sqrt(kT / k), k the MMFF curvature along that bond.
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles("CCO"))
    AllChem.EmbedMolecule(mol, randomSeed=0)
    AllChem.MMFFOptimizeMolecule(mol, maxIters=2000)
    x = mol.GetConformer().GetPositions()
    b = ethanol.bonds
    L = np.linalg.norm(ethanol.positions[:, b[:, 0]] - ethanol.positions[:, b[:, 1]], axis=-1)
    L_min = np.linalg.norm(x[b[:, 0]] - x[b[:, 1]], axis=-1)
    assert np.abs(L.mean(0) - L_min).max() < 0.02  # Å
    ff = AllChem.MMFFGetMoleculeForceField(mol, AllChem.MMFFGetMoleculeProperties(mol))
    E = lambda y: ff.CalcEnergy(y.ravel().tolist())
    u = (x[3] - x[0]) / np.linalg.norm(x[3] - x[0])  # C0-H3, a terminal hydrogen
    h, shift = 1e-3, np.zeros_like(x)
    shift[3] = h * u
    k = (E(x + shift) + E(x - shift) - 2 * E(x)) / h**2  # kcal/mol/Å^2
    expected = np.sqrt(conformers.KB_KCAL * 300.0 / k)  # ~0.03 Å
    ch = [i for i, (p, q) in enumerate(b) if {ethanol.labels[0, p], ethanol.labels[0, q]} == {1, 6}]
    spread = (L[:, ch] - L[:, ch].mean(0)).std()
    assert 0.85 * expected < spread < 1.4 * expected, (spread, expected)
    assert ethanol.stats["acceptance"] > 0.3 and ethanol.stats["torsion_acceptance"] > 0.05


def test_torsions_move_between_minima(ethanol):
    # bug caught: torsion moves never accepted (or rotating the wrong side), leaving each
    # chain in its starting rotamer: the C-C-O-H dihedral would sit in one or two wells
    X = ethanol.positions
    b0, b1, b2 = X[:, 0] - X[:, 1], X[:, 2] - X[:, 1], X[:, 8] - X[:, 2]
    b1 /= np.linalg.norm(b1, axis=-1, keepdims=True)
    v = b0 - (b0 * b1).sum(-1, keepdims=True) * b1
    w = b2 - (b2 * b1).sum(-1, keepdims=True) * b1
    phi = np.degrees(np.arctan2((np.cross(b1, v) * w).sum(-1), (v * w).sum(-1)))
    per_chain = phi.reshape(-1, 4)
    # every chain visits both the anti (|phi| > 120) and a gauche (|phi| < 120) region
    assert ((np.abs(per_chain) > 120).any(0) & (np.abs(per_chain) < 120).any(0)).all()


def test_save_load_cache_and_load_point_clouds(tmp_path, ethanol, monkeypatch):
    # bug caught: a cache that regenerates every time, or silently returns another ensemble;
    # a file `grassflow train --data` cannot read
    path = conformers.save_ensemble(tmp_path / "e.npz", ethanol)
    back = conformers.load_ensemble(path)
    np.testing.assert_array_equal(back.positions, ethanol.positions)
    np.testing.assert_array_equal(back.labels, ethanol.labels)
    np.testing.assert_array_equal(back.bonds, ethanol.bonds)
    assert back.smiles == "CCO" and back.stats["acceptance"] == ethanol.stats["acceptance"]
    clouds = load_point_clouds(path)
    np.testing.assert_array_equal(clouds.positions, ethanol.positions)
    assert (clouds.labels == ethanol.labels).all()

    def boom(*args, **kwargs):
        raise AssertionError("regenerated")

    monkeypatch.setattr(conformers, "conformer_ensemble", boom)
    cached = conformers.cached_ensemble(path, "CCO", 200, seed=0, **SMALL)
    np.testing.assert_array_equal(cached.positions, ethanol.positions)
    with pytest.raises(ValueError, match="seed"):
        conformers.cached_ensemble(path, "CCO", 200, seed=1, **SMALL)


def test_bad_input_is_named():
    pytest.importorskip("rdkit")
    with pytest.raises(ValueError, match="n must be an integer"):
        conformers.conformer_ensemble("CCO", 0)
    with pytest.raises(ValueError, match="temperature"):
        conformers.conformer_ensemble("CCO", 4, temperature=-1.0)
    with pytest.raises(ValueError, match="cannot parse"):
        conformers.conformer_ensemble("C1CC", 4)
