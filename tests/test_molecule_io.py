"""Molecules that keep their bonds (issue 35): SDF writing (plain Python) checked by RDKit's own
reader, SDF/.npz reading checked against RDKit's molecules, `save_ensemble` files, every
error a user's file can raise, and ``grassflow data conformers``."""

import sys
from pathlib import Path

import numpy as np
import pytest

from grassflow.cli import main
from grassflow.cli.data_commands import conformers_path
from grassflow.data import conformers
from grassflow.data.molecule_files import (
    bond_table,
    check_bonds,
    find_hand,
    molblock_charges,
    read_sdf,
    write_sdf,
)
from grassflow.data.point_clouds import load_point_clouds

Chem = pytest.importorskip("rdkit.Chem")
from rdkit.Chem import AllChem  # noqa: E402


def embedded(smiles: str, k: int = 3, seed: int = 7):
    """``AddHs(MolFromSmiles(smiles))`` with ``k`` ETKDG conformers."""
    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    assert len(AllChem.EmbedMultipleConfs(mol, k, randomSeed=seed)) == k
    return mol


def rdkit_sdf(path, mol):
    """Every conformer of ``mol`` as one record, written by RDKit."""
    with Chem.SDWriter(str(path)) as w:
        for conf in mol.GetConformers():
            w.write(mol, confId=conf.GetId())
    return path


def graph(mol):
    """``{(i, j): order}`` with ``i < j``, RDKit's bond orders (aromatic 1.5)."""
    return {tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))): b.GetBondTypeAsDouble()
            for b in mol.GetBonds()}  # fmt: skip


def table(pc):
    return {tuple(b): o for b, o in zip(pc.bonds.tolist(), pc.bond_orders.tolist())}


def positions(mol):
    return np.stack([c.GetPositions() for c in mol.GetConformers()])


def canonical(smiles):
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


# --- write_sdf -------------------------------------------------------------------------


def test_write_sdf_is_read_by_rdkit_as_written(tmp_path):
    # bug caught: 0-based indices in the bond block, columns off by one, aromatic written as
    # another type, records not separated, titles lost, coordinates rounded wrongly
    mol = embedded("Cc1ccccc1")
    P = positions(mol) + np.random.default_rng(0).normal(0, 1e-3, (3, 15, 1))
    Z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    g = graph(mol)
    bonds = np.array([(j, i, o) for (i, j), o in g.items()])[::-1]  # reversed pairs and rows
    path = write_sdf(tmp_path / "out" / "t.sdf", P, Z, bonds, titles=["a", "b", "c"])
    back = list(Chem.SDMolSupplier(str(path), removeHs=False, sanitize=True))
    assert len(back) == 3 and all(m is not None for m in back)
    for m, X, title in zip(back, P, "abc"):
        np.testing.assert_allclose(m.GetConformer().GetPositions(), X, atol=5.1e-5)
        assert [a.GetAtomicNum() for a in m.GetAtoms()] == Z.tolist()
        assert graph(m) == g and m.GetProp("_Name") == title
    assert Chem.MolToSmiles(Chem.RemoveHs(back[0])) == "Cc1ccccc1"


def test_write_sdf_round_trips_through_load_point_clouds(tmp_path):
    # bug caught: a writer and reader that disagree on bond order or atom order
    mol = embedded("CC(=O)C#N")
    P, g = positions(mol), graph(mol)
    Z = [a.GetAtomicNum() for a in mol.GetAtoms()]
    pairs = np.array(list(g), dtype=np.int64)
    write_sdf(tmp_path / "m.sdf", P, np.array(Z), pairs, np.array(list(g.values())))
    pc = load_point_clouds(tmp_path / "m.sdf")
    np.testing.assert_allclose(pc.positions, P, atol=5.1e-5)
    assert (pc.labels == Z).all() and table(pc) == g and sorted(set(g.values())) == [1, 2, 3]
    assert pc.smiles == canonical("CC(=O)C#N") and pc.sources[2] == "m.sdf#record2"


def test_charges_written_keep_a_charged_molecule_readable(tmp_path):
    # bug caught: formal charges dropped, so RDKit rejects the nitro nitrogen's valence
    src = load_point_clouds(rdkit_sdf(tmp_path / "n.sdf", embedded("CC[N+](=O)[O-]", 2)))
    q = molblock_charges(src.molblock)
    assert sorted(q.tolist()) == [-1] + [0] * 8 + [1]
    write_sdf(tmp_path / "out.sdf", src.positions, src.labels[0], src.bonds, src.bond_orders,
              charges=q)  # fmt: skip
    assert load_point_clouds(tmp_path / "out.sdf").smiles == "CC[N+](=O)[O-]"


@pytest.mark.parametrize("case, match", [
    ("atoms", "at most 999"), ("index", "out of range"), ("shape", r"\(N, n, 3\)"),
    ("element", "1 to 118"), ("order", "order"), ("title", "one-line"),
])  # fmt: skip
def test_write_sdf_refuses_what_v2000_cannot_hold(tmp_path, case, match):
    # bug caught: a file that RDKit misreads (shifted columns beyond 999, H as a dummy, a
    # bond to a missing atom) written without complaint
    n = 1000 if case == "atoms" else 5
    P, Z, b = np.random.default_rng(0).normal(size=(2, n, 3)), np.full(n, 6), [[0, 1]]
    kw = {}
    if case == "index":
        b = [[0, 5]]
    elif case == "shape":
        P = P[..., :2]
    elif case == "element":
        Z[2] = 0
    elif case == "order":
        kw["bond_orders"] = [4.0]
    elif case == "title":
        kw["titles"] = ["a\nb", "c"]
    with pytest.raises(ValueError, match=match):
        write_sdf(tmp_path / "x.sdf", P, Z, np.array(b), **kw)
    assert not (tmp_path / "x.sdf").exists()


# --- reading SDF -----------------------------------------------------------------------


def test_rdkit_sdf_loads_with_the_molecules_own_bonds(tmp_path):
    # bug caught: bonds from another record or atom order, hydrogens removed, a molblock
    # RDKit cannot rebuild the molecule from
    mol = embedded("CC(O)C")
    pc = load_point_clouds(rdkit_sdf(tmp_path / "p.sdf", mol))
    np.testing.assert_allclose(pc.positions, positions(mol), atol=5.1e-5)
    assert pc.positions.shape == (3, 12, 3) and (pc.labels == [6, 6, 8, 6] + [1] * 8).all()
    assert table(pc) == graph(mol) and set(pc.bond_orders) == {1.0}
    assert pc.bonds.dtype == np.int64 and (pc.bonds[:, 0] < pc.bonds[:, 1]).all()
    assert pc.smiles == canonical("CC(O)C") and pc.labels_from == "sdf atoms"
    again = Chem.MolFromMolBlock(pc.molblock, removeHs=False)
    assert again.GetNumAtoms() == 12 and Chem.MolToSmiles(Chem.RemoveHs(again)) == pc.smiles


def test_aromatic_bonds_are_one_and_a_half(tmp_path):
    # bug caught: Kekulé orders (1/2, which depend on the record) kept instead of aromatic
    mol = embedded("Cc1ccccc1")
    pc = read_sdf(rdkit_sdf(tmp_path / "t.sdf", mol))
    ring = [o for (i, j), o in table(pc).items() if {pc.labels[0, i], pc.labels[0, j]} == {6}]
    assert sorted(ring) == [1.0] + [1.5] * 6 and table(pc) == graph(mol)
    assert Chem.MolToSmiles(Chem.MolFromMolBlock(pc.molblock)) == "Cc1ccccc1"


def test_mol_file_of_one_conformer(tmp_path):
    # bug caught: a .mol (no $$$$) refused or read as zero records
    mol = embedded("CCCO", 1)
    (tmp_path / "a.mol").write_text(Chem.MolToMolBlock(mol))
    assert load_point_clouds(tmp_path / "a.mol").positions.shape == (1, 12, 3)


def sdf_of(tmp_path, *mols):
    """One SDF with the conformers of each mol in turn."""
    text = "".join(Chem.MolToMolBlock(m, confId=c.GetId()) + "$$$$\n"
                   for m in mols for c in m.GetConformers())  # fmt: skip
    (tmp_path / "x.sdf").write_text(text)
    return tmp_path / "x.sdf"


@pytest.mark.parametrize("other, match", [
    ("CC", "record 3 has 8 atoms, record 0 has 12"),
    ("CCOC", "record 3 has O at atom 2, record 0 has C"),  # C3H8O either way
    ("CC(C)O", "record 3 has a different bond table"),  # same element sequence as CCCO
])  # fmt: skip
def test_mixed_molecules_are_refused(tmp_path, other, match):
    # bug caught: records of another molecule silently mixed into one training set
    path = sdf_of(tmp_path, embedded("CCCO"), embedded(other, 1))
    with pytest.raises(ValueError, match=f"mixed molecules: {match}.*one molecule per file"):
        load_point_clouds(path)


def test_unreadable_record_is_named_not_skipped(tmp_path):
    # bug caught: SDMolSupplier's None silently dropped, the user never told which record
    mol = embedded("CCO", 2)
    good = Chem.MolToMolBlock(mol)
    bad = Chem.MolToMolBlock(mol, confId=1).replace("  1  2  1  0", "  1  2  3  0", 1)
    (tmp_path / "x.sdf").write_text(good + "$$$$\n" + bad + "$$$$\n")
    with pytest.raises(ValueError, match=r"record 1 cannot be read \(RDKit: .*valence"):
        load_point_clouds(tmp_path / "x.sdf")


@pytest.mark.parametrize("how", ["no conformer", "2-D"])
def test_atoms_without_coordinates_are_refused(tmp_path, how):
    # bug caught: a SMILES-only or 2-D SDF (z all zero) taken as flat conformers
    mol = Chem.AddHs(Chem.MolFromSmiles("CCCO"))
    if how == "2-D":
        AllChem.Compute2DCoords(mol)
    (tmp_path / "x.sdf").write_text(Chem.MolToMolBlock(mol) + "$$$$\n")
    with pytest.raises(ValueError, match="record 0 has atoms without coordinates"):
        load_point_clouds(tmp_path / "x.sdf")


def test_empty_sdf_and_missing_rdkit(tmp_path, monkeypatch):
    # bug caught: an empty file read as zero clouds further down; a bare ModuleNotFoundError
    (tmp_path / "e.sdf").write_text("")
    with pytest.raises(ValueError, match="no records"):
        load_point_clouds(tmp_path / "e.sdf")
    monkeypatch.setitem(sys.modules, "rdkit", None)
    with pytest.raises(ImportError, match=r'pip install "grassflow\[molecules\]"'):
        load_point_clouds(tmp_path / "e.sdf")


# --- .npz and save_ensemble ------------------------------------------------------------


def ethanol_npz(tmp_path, **arrays):
    mol = embedded("CCO", 4)
    Z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    np.savez(tmp_path / "e.npz", positions=positions(mol), atomic_numbers=Z, **arrays)
    return tmp_path / "e.npz", mol


def test_npz_bonds_with_two_or_three_columns(tmp_path):
    # bug caught: (B, 3) read as three atom indices, orders not permuted with the sorted
    # pairs, 0-d string arrays read as arrays
    pairs = np.array([(1, 0), (2, 1), (0, 3), (4, 0), (5, 0), (1, 6), (1, 7), (8, 2)])
    path, mol = ethanol_npz(tmp_path, bonds=pairs, smiles=np.array("CCO"))
    pc = load_point_clouds(path)
    assert {tuple(b) for b in pc.bonds.tolist()} == set(graph(mol)) and pc.bond_orders is None
    assert pc.smiles == "CCO" and pc.labels_from == "e.npz:atomic_numbers"
    orders = np.array([1, 1, 1, 1, 1, 1, 1.5, 2])  # not chemistry: tests the permutation
    np.savez(path, positions=positions(mol), labels=pc.labels[0],
             bonds=np.column_stack([pairs, orders]))  # fmt: skip
    pc = load_point_clouds(path)
    expect = {tuple(sorted(p)): o for p, o in zip(pairs.tolist(), orders)}
    assert table(pc) == expect and list(map(tuple, pc.bonds.tolist())) == sorted(expect)


def test_save_ensemble_file_loads_with_its_bonds(tmp_path):
    # bug caught: bonds, orders or molblock of a `data conformers` file lost on the way to
    # `train --data`; old files (no orders, no molblock) no longer readable
    mol = embedded("CC=O", 3)
    P, g = positions(mol), graph(mol)
    Z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    labels, bonds = np.broadcast_to(Z, (3, 7)).copy(), np.array(list(g))[::-1]
    ens = conformers.ConformerEnsemble(P, labels, ["a", "b", "c"], [], bonds=bonds, smiles="CC=O")
    path = conformers.save_ensemble(tmp_path / "f.npz", ens)
    with np.load(path) as z:
        assert (z["atomic_numbers"] == Z).all()
    pc = load_point_clouds(path)
    assert table(pc) == g and pc.smiles == "CC=O" and 2.0 in g.values()
    back = Chem.MolFromMolBlock(pc.molblock, removeHs=False)
    np.testing.assert_allclose(back.GetConformer().GetPositions(), P[0], atol=5.1e-5)
    assert Chem.MolToSmiles(Chem.RemoveHs(back)) == canonical("CC=O")
    assert table(conformers.load_ensemble(path)) == g
    np.savez(path, positions=P, labels=Z, bonds=np.array(sorted(g)), smiles=np.array("CC=O"))
    old = conformers.load_ensemble(path)
    assert old.bond_orders is None and old.molblock is None and len(old.bonds) == len(g)
    assert {tuple(b) for b in load_point_clouds(path).bonds.tolist()} == set(g)


def test_rank_deficient_clouds_dropped_chemistry_kept(tmp_path):
    # bug caught: dropping a cloud rebuilds PointClouds and loses the bonds (and labels_from)
    mol = embedded("CCO", 3)
    P = positions(mol)
    P[1] = np.linspace(0, 1, 9)[:, None] * [1.0, 2.0, 3.0]  # collinear
    np.savez(tmp_path / "e.npz", positions=P, labels=[6, 6, 8] + [1] * 6,
             bonds=np.array(sorted(graph(mol))), smiles=np.array("CCO"))  # fmt: skip
    with pytest.warns(UserWarning, match="rank-deficient"):
        pc = load_point_clouds(tmp_path / "e.npz")
    assert len(pc.positions) == 2 and "collinear" in pc.skipped[0]
    assert len(pc.bonds) == 8 and pc.smiles == "CCO" and pc.labels_from == "e.npz:labels"


@pytest.mark.parametrize("arrays, match", [
    ({"bonds": [[0, 9]]}, r"bond 0 \(0, 9\) names an atom index out of range"),
    ({"bonds": [[0, 1], [2, 2]]}, r"bond 1 \(2, 2\) is a self-bond"),
    ({"bonds": [[0, 1], [1, 0]]}, "duplicate bonds: atoms 0 and 1"),
    ({"bonds": [[0, 1, 1, 1]]}, r"must be \(B, 2\).*got shape \(1, 4\)"),
    ({"bonds": [[0.5, 1]]}, "must be integers"),
    ({"bonds": [[0, 1]], "bond_orders": [4]}, "bond 0 has order 4;"),
    ({"bonds": [[0, 1, 2]], "bond_orders": [1]}, "disagree"),
    ({"bond_orders": [1.0]}, "bond_orders without bonds"),
    ({"labels": [6, 6, 8] + [1] * 5 + [6]}, "labels and atomic_numbers disagree"),
    ({"smiles": np.array(["CCO"])}, "0-d string"),
    ({"bonds": [[0, 1]], "molblock": np.array(Chem.MolToMolBlock(Chem.MolFromSmiles("CC")))},
     "molblock atoms"),
])  # fmt: skip
def test_bad_npz_molecules_are_named(tmp_path, arrays, match):
    # bug caught: a bad bond table (or mismatched atoms) accepted and broken later in training
    path, _ = ethanol_npz(tmp_path, **arrays)
    with pytest.raises(ValueError, match=f"{path.name}.*{match}"):
        load_point_clouds(path)


def test_bonds_without_labels_are_refused(tmp_path):
    # bug caught: a graph whose atoms are unknown taken as a molecule
    np.savez(tmp_path / "b.npz", positions=np.random.default_rng(0).normal(size=(3, 6, 3)),
             bonds=[[0, 1]])  # fmt: skip
    with pytest.raises(ValueError, match="bonds without labels"):
        load_point_clouds(tmp_path / "b.npz")


def test_check_bonds_is_canonical():
    # bug caught: i > j pairs or an unsorted table passed on to the model
    b = check_bonds(np.array([[3, 1], [0, 2], [1, 0]]), 4, "x")
    assert b.tolist() == [[0, 1], [0, 2], [1, 3]] and b.dtype == np.int64
    assert bond_table(np.zeros((0, 2), int), 4, "x")[0].shape == (0, 2)


# --- grassflow data conformers ---------------------------------------------------------

QUICK = ["--chains", "2", "--burn-in", "20", "--thin", "2", "--no-progress"]


def test_data_conformers_writes_what_train_reads(tmp_path, monkeypatch, capsys):
    # bug caught: the command's file lacks the bonds, its default name is not a file name,
    # an existing file is overwritten, the .sdf output is not one molecule's conformers
    monkeypatch.chdir(tmp_path)
    assert main(["data", "conformers", "CC(=O)O", "--n", "6", "--temperature", "350",
                 *QUICK]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "wrote data/CC_O_O.npz: 6 conformers" in out and "train --data data/CC_O_O.npz" in out
    pc = load_point_clouds("data/CC_O_O.npz")
    assert pc.positions.shape == (6, 8, 3) and sorted(pc.bond_orders) == [1] * 6 + [2]
    assert pc.smiles == "CC(=O)O" and pc.molblock
    assert conformers.load_ensemble("data/CC_O_O.npz").stats["temperature"] == 350.0
    assert main(["data", "conformers", "CC(=O)O", "--n", "6", *QUICK]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["data", "conformers", "CC(=O)O", "--n", "6", "--out", "a.sdf", *QUICK]) == 0
    sdf = load_point_clouds("a.sdf")
    assert table(sdf) == table(pc) and sdf.smiles == "CC(=O)O"
    assert main(["data", "conformers", "CCO", "--n", "2", "--out", "a.xyz", *QUICK]) == 2


def test_default_conformer_file_names():
    # bug caught: SMILES punctuation (/, \, #, brackets) in file names
    assert conformers_path("CCO").as_posix() == "data/CCO.npz"
    assert conformers_path("F/C=C/F").as_posix() == "data/F_C_C_F.npz"
    assert conformers_path("[#6]").as_posix() == "data/6.npz"
    assert conformers_path("()").as_posix() == "data/molecule.npz"
    long = conformers_path("C" * 50).stem
    assert len(long) == 41 and long != conformers_path("C" * 51).stem


# --- the user's path: SMILES -> conformers -> train -> sample -> SDF ---------------------


def test_smiles_to_conformers_to_model_to_sdf(tmp_path, monkeypatch, capsys):
    # bug caught: the bond table not reaching the run (its preset, the field's edge features,
    # the harmonic prior), samples written without their bonds, an SDF that RDKit does not
    # read back as the data's molecule, --no-bonds or --prior ignored
    import json

    from grassflow.tasks import shape_runs as shapes

    monkeypatch.chdir(tmp_path)
    assert main(["data", "conformers", "CCO", "--n", "40", *QUICK]) == 0
    # the default for a molecule: internal coordinates, named, its Z-matrix printed; its
    # samples go to an SDF with the data's bonds and keep them
    default = ["train", "--data", "data/CCO.npz", "--iterations", "20", "--no-eval",
               "--no-progress", "--run-dir", "internal"]  # fmt: skip
    assert main(default) == 0
    out = capsys.readouterr().out
    assert "model: InternalFlow" in out and "Z-matrix of 9 atoms" in out
    assert "trained InternalFlow (internal coordinates" in out
    exp = json.loads((tmp_path / "internal" / "experiment.json").read_text())
    assert exp["geometry"] == "internal" and exp["hand"] is None
    assert main(["sample", "internal", "--n", "5", "--out", "i.sdf"]) == 0
    data, samples = load_point_clouds("data/CCO.npz"), load_point_clouds("i.sdf")
    assert table(samples) == table(data) and "InternalFlow" in Path("i.sdf").read_text()
    lengths = lambda P: np.linalg.norm(P[:, data.bonds[:, 0]] - P[:, data.bonds[:, 1]], axis=-1)
    assert np.abs(lengths(samples.positions) / lengths(data.positions).mean(0) - 1).max() < 0.1

    train = ["train", "--data", "data/CCO.npz", "--iterations", "2", "--lr", "1e-9", "--atol",
             "1e-4", "--rtol", "1e-4", "--no-eval", "--no-progress", "--geometry",
             "cartesian"]  # fmt: skip
    assert main([*train, "--run-dir", "run"]) == 0
    assert "bonds: 8 (with orders) of CCO" in capsys.readouterr().out
    assert main([*train, "--run-dir", "run", "--resume", "--iterations", "3"]) == 0  # same run
    exp = json.loads((tmp_path / "run" / "experiment.json").read_text())
    assert exp["use_bonds"] and exp["harmonic_prior"] and len(exp["bonds"]) == 8
    _, model = shapes.load_run("run")
    assert model.prior == "harmonic" and model.field.edges is not None
    # MCMC never swaps the labelled hydrogens of a CH2: its conformers keep one hand
    assert model.hand is not None and tuple(model.hand.tolist()) == tuple(exp["hand"])
    assert (tmp_path / "run" / "molecule.mol").exists()
    assert main(["sample", "run", "--n", "5", "--out", "s.sdf"]) == 0
    data, samples = load_point_clouds("data/CCO.npz"), load_point_clouds("s.sdf")
    assert samples.positions.shape == (5, 9, 3) and table(samples) == table(data)
    c, *js = exp["hand"]
    assert (np.linalg.det(samples.positions[:, js] - samples.positions[:, [c]]) > 0).all()
    assert (samples.labels == data.labels[0]).all() and samples.smiles == "CCO"

    assert main([*train, "--run-dir", "plain", "--no-bonds"]) == 0
    _, plain = shapes.load_run("plain")
    assert plain.prior == "gaussian" and plain.field.edges is None and plain.labels is not None
    assert plain.hand is None
    assert main([*train, "--run-dir", "bad", "--no-bonds", "--prior", "harmonic"]) == 2
    assert "harmonic prior needs the bonds" in capsys.readouterr().err
    np.save("plain.npy", data.positions)
    assert main([*train, "--data", "plain.npy", "--run-dir", "bad", "--prior", "harmonic"]) == 2
    assert "plain.npy has none" in capsys.readouterr().err


def test_internal_run_resumes_bit_exactly_and_continues_its_symmetry(tmp_path, monkeypatch):
    # bug caught: a resumed internal-coordinate run that does not go on as an uninterrupted
    # one (its optimizer, RNG, whitening, torsion cuts or fitted base mixture not restored),
    # or that chooses its mirror row anew
    import json

    import torch

    monkeypatch.chdir(tmp_path)
    assert main(["data", "conformers", "OCC(O)CO", "--n", "60", *QUICK]) == 0
    data = str(next((tmp_path / "data").glob("*.npz")))
    train = ["train", "--data", data, "--no-eval", "--no-progress"]
    assert main([*train, "--run-dir", "whole", "--iterations", "40"]) == 0
    assert main([*train, "--run-dir", "cut", "--iterations", "20"]) == 0
    assert main([*train, "--run-dir", "cut", "--iterations", "40", "--resume"]) == 0
    whole, cut = (torch.load(tmp_path / r / "flow" / "last.pt", weights_only=False)["model"]
                  for r in ("whole", "cut"))  # fmt: skip
    assert whole.keys() == cut.keys() and {"loc", "scale_tril", "cut"} <= set(whole)
    for k in whole:
        assert torch.equal(whole[k], cut[k]), k
    a, b = (json.loads((tmp_path / r / "experiment.json").read_text()) for r in ("whole", "cut"))
    assert a["geometry"] == b["geometry"] == "internal" and a["mirror_row"] == b["mirror_row"]


def test_find_hand_picks_the_centre_farthest_from_flat():
    # bug caught (issue 42's audit): the last qualifying centre chosen, not the one farthest
    # from flat, so that a nearly flat centre (one noisy conformer from flipping) decides the
    # hand. Centre 0 is a firm tetrahedron; centre 4, later in the order, qualifies too
    # (every det negative, min/median 0.33 > 0.1) but is far flatter
    rng = np.random.default_rng(0)
    N = 50
    X = np.zeros((N, 7, 3))
    X[:, 1:4] = np.eye(3) + 0.05 * rng.standard_normal((N, 3, 3))
    X[:, 4] = (5.0, 0.0, 0.0)
    X[:, 5] = (5.0, 1.0, 0.0)
    X[:, 6, 0] = 5.0
    X[:, 6, 2] = np.linspace(0.2, 1.0, N)  # det[x3 - x4, x5 - x4, x6 - x4] = -5 t
    bonds = np.array([[0, 1], [0, 2], [0, 3], [3, 4], [4, 5], [4, 6]])
    c, *js = find_hand(X, bonds)
    assert c == 0 and sorted(js) == [1, 2, 3]
    assert (np.linalg.det(X[:, js] - X[:, [c]]) > 0).all()
    assert find_hand(X, bonds[3:]) is not None  # the flat centre alone still qualifies
