"""LJ55 (issue 34): its energy, its MCMC defaults and the split of generated chains."""

import numpy as np
import pytest
import torch

from grassflow.data.mcmc import DATASET_DEFAULTS, make_dataset
from grassflow.data.particles import get_system, lj13_energy, lj55_energy


def _brute_force(x):
    """Double-counted LJ over ordered pairs plus 0.5 |x - mean|^2, by explicit loops."""
    n = x.shape[0]
    u = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                r = torch.linalg.vector_norm(x[i] - x[j])
                u += r**-12 - 2 * r**-6
    return u + 0.5 * (x - x.mean(0)).square().sum()


def test_lj55_energy_is_the_lj13_potential_with_55_particles():
    # bug caught: a pair sum over the wrong pairs (once vs twice), a missing harmonic term,
    # or LJ13's particle count hard-wired in the shared energy
    g = torch.Generator().manual_seed(0)
    x = 2.0 * torch.randn(55, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(lj55_energy(x[None])[0], _brute_force(x))
    y = x[:13]
    torch.testing.assert_close(lj13_energy(y[None])[0], _brute_force(y))
    assert get_system("lj55").n_particles == 55
    with pytest.raises(ValueError, match=r"\(\.\.\., 55, 3\)"):
        lj55_energy(y[None])


def test_lj55_mcmc_starts_from_a_non_overlapping_cluster_and_lowers_the_energy():
    # bug caught: LJ55 started from overlapping particles (infinite energies) or defaults that
    # do not move the chains
    X, stats = make_dataset("lj55", 8, n_chains=4, burn_in=200, thin=100, progress=False)
    E = lj55_energy(torch.as_tensor(X, dtype=torch.float64).reshape(-1, 55, 3))
    assert torch.isfinite(E).all() and 0.3 < stats["acceptance"] < 0.9
    assert X.shape == (8, 165) and DATASET_DEFAULTS["lj55"]["n_chains"] == 500


def test_lj55_splits_keep_whole_chains_apart(tmp_path):
    # bug caught: a split by rows, which puts states of one chain in train and test
    pytest.importorskip("grassflow_paper")
    from grassflow_paper.efm import LJ55_SPLIT, load_lj55_splits

    chains, states = 500, 2
    # row (state s, chain c) carries the chain's id in every coordinate, plus the state
    rng = np.random.default_rng(0)
    base = rng.normal(size=(chains, 165)).astype(np.float32)  # one shape per chain
    X = np.concatenate([base + 1e-4 * s for s in range(states)])  # time-major rows
    np.save(tmp_path / "lj55.npy", X)
    out = load_lj55_splits(400, str(tmp_path))
    # each split's clouds, matched to chains by their (centred) first point's x
    raw = torch.as_tensor(X, dtype=torch.float64).reshape(states, chains, 55, 3)
    key = lambda P: P[..., 0, 0] - P[..., :, 0].mean(-1)  # noqa: E731
    chain_keys = key(raw - raw.mean(-2, keepdim=True))[0]  # (chains,)
    owner = {}
    for name in ("train", "val", "test"):
        for k in key(out[name]).tolist():
            chain = int((chain_keys - k).abs().argmin())
            owner.setdefault(chain, set()).add(name)
    assert all(len(names) == 1 for names in owner.values())  # no chain in two splits
    seen = {name: len(out[name]) for name in ("train", "val", "test")}
    a, b, c = LJ55_SPLIT
    assert seen == {"train": 400, "val": b * states, "test": c * states}
    with pytest.raises(ValueError, match="n_train"):
        load_lj55_splits(a * states + 1, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="grassflow data make lj55"):
        load_lj55_splits(10, str(tmp_path / "missing"))


def test_data_make_lj55_writes_the_file_the_splits_read(tmp_path):
    # bug caught: `data make lj55` looking up a paper-protocol file name that LJ55 has not
    from grassflow.cli import main

    assert main(["data", "make", "lj55", "--n", "8", "--chains", "4", "--burn-in", "20",
                 "--thin", "10", "--out", str(tmp_path), "--no-progress"]) == 0  # fmt: skip
    X = np.load(tmp_path / "lj55.npy")
    assert X.shape == (8, 165) and np.isfinite(X).all()
