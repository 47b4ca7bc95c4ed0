"""`minimized_ensemble` and ``grassflow data conformers --minimized``: MMFF94-minimized ETKDG
embeddings, the kind of file users bring. Independent computations: RDKit's own MMFF94
gradient and energy of each returned geometry, and the un-minimized embeddings."""

import numpy as np
import pytest

pytest.importorskip("rdkit")
from rdkit import Chem  # noqa: E402
from rdkit.Chem import AllChem  # noqa: E402

from grassflow.cli import main  # noqa: E402
from grassflow.data import conformers  # noqa: E402
from grassflow.data.point_clouds import load_point_clouds  # noqa: E402

SMILES = "CCCCO"
N = 12


@pytest.fixture(scope="module")
def ensemble():
    return conformers.minimized_ensemble(SMILES, N, seed=3)


def _mmff(positions: np.ndarray) -> tuple[float, float]:
    """RDKit's MMFF94 energy (kcal/mol) and gradient norm (kcal/mol/Å) at ``positions``."""
    mol = Chem.AddHs(Chem.MolFromSmiles(SMILES))
    conf = Chem.Conformer(mol.GetNumAtoms())
    for i, p in enumerate(positions):
        conf.SetAtomPosition(i, p.tolist())
    mol.AddConformer(conf)
    ff = AllChem.MMFFGetMoleculeForceField(mol, AllChem.MMFFGetMoleculeProperties(mol))
    return ff.CalcEnergy(), float(np.linalg.norm(ff.CalcGrad()))


def test_every_conformer_is_a_distinct_mmff_minimum(ensemble):
    """Catches geometries returned un-minimized or half-minimized (RDKit's MMFF94 gradient
    at each is below 0.05 kcal/mol/Å; measured 0.0001-0.002, against 67-120 for the
    embeddings), and RDKit's seed-0 trap
    (randomSeed 0 embeds one conformer N times): the conformers differ pairwise and hold
    more than one torsional minimum."""
    X = ensemble.positions
    assert X.shape == (N, 15, 3) and ensemble.stats["converged"] == N
    for x in X:
        assert _mmff(x)[1] < 0.05
    i, j = np.triu_indices(N, 1)
    assert np.abs(X[i] - X[j]).max((1, 2)).min() > 1e-3
    energies = np.array([_mmff(x)[0] for x in X])
    assert energies.max() - energies.min() > 0.1  # several minima, not one
    assert abs(energies.mean() - ensemble.stats["mean_energy"]) < 1e-6


def test_minimizing_lowers_each_embeddings_energy(ensemble):
    """Catches positions taken from the embeddings instead of the minimized conformers:
    each returned energy is below that of the ETKDG embedding with the same seed."""
    mol = Chem.AddHs(Chem.MolFromSmiles(SMILES))
    params = AllChem.ETKDGv3()
    params.randomSeed = 3 + 1  # as minimized_ensemble passes seed 3
    params.pruneRmsThresh = -1.0
    ids = list(AllChem.EmbedMultipleConfs(mol, N, params))
    for k, x in zip(ids, ensemble.positions):
        raw = _mmff(mol.GetConformer(k).GetPositions())[0]
        assert _mmff(x)[0] < raw


def test_bonds_and_determinism(ensemble):
    """Catches a bond table out of the molecule's atom order and a run-to-run difference."""
    mol = Chem.AddHs(Chem.MolFromSmiles(SMILES))
    want = sorted(tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))) for b in mol.GetBonds())
    assert [tuple(b) for b in ensemble.bonds.tolist()] == want
    again = conformers.minimized_ensemble(SMILES, N, seed=3)
    assert np.array_equal(again.positions, ensemble.positions)
    other = conformers.minimized_ensemble(SMILES, N, seed=4)
    assert not np.allclose(other.positions, ensemble.positions)
    with pytest.raises(ValueError, match="n must be"):
        conformers.minimized_ensemble(SMILES, 0)


def test_cli_writes_minimized_conformers_that_train_reads(tmp_path, monkeypatch, capsys):
    """Catches --minimized ignored (the file must hold minima), a default name that
    overwrites the thermal file of the same SMILES, and MCMC settings silently ignored or
    hidden behind another error (the default file exists by then)."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "conformers", SMILES, "--n", "5", "--minimized", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "data/CCCCO-minimized.npz: 5 conformers" in out and "minimized" in out
    pc = load_point_clouds("data/CCCCO-minimized.npz")
    assert pc.positions.shape == (5, 15, 3) and pc.smiles == SMILES and pc.molblock
    for x in pc.positions:
        assert _mmff(x)[1] < 0.05
    assert main(["data", "conformers", SMILES, "--n", "5", "--minimized", "--out", "m.sdf",
                 "--no-progress"]) == 0  # fmt: skip
    np.testing.assert_allclose(load_point_clouds("m.sdf").positions, pc.positions, atol=1e-4)
    assert main(["data", "conformers", SMILES, "--n", "5", "--minimized", "--thin", "3",
                 "--chains", "2"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--chains, --thin: settings of the MCMC sampler" in err and "exists" not in err
