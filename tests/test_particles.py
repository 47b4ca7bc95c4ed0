"""Particle-system energies (DW4, LJ13) and the vectorised MCMC sampler."""

import math

import numpy as np
import pytest
import torch

from conftest import mc_tolerance, random_orthogonal
from grassflow.data.mcmc import make_dataset, sample_mcmc, save_dataset
from grassflow.data.particles import (
    SYSTEMS,
    ParticleSystem,
    dw4_energy,
    get_system,
    lj13_energy,
    lj55_energy,
    pair_distances,
)


def _lj13_config(batch: int = 3) -> torch.Tensor:
    # a perturbed 3x3x3 grid (spacing 1.1, 13 of its 27 sites): no two particles overlap
    grid = torch.stack(torch.meshgrid(*[torch.arange(3.0)] * 3, indexing="ij"), -1)
    sites = 1.1 * grid.reshape(27, 3)
    x = torch.stack([sites[torch.randperm(27)[:13]] for _ in range(batch)])
    return x + 0.1 * torch.randn_like(x)


# ------------------------------------------------------------------ energies
def test_dw4_square_by_hand():
    # square of side d0 = 4: the 4 sides sit at the top of the barrier (s = 0), the two
    # diagonals at s = 4 sqrt(2) - 4; 1/(2 tau) * ordered pairs = once per unordered pair
    x = torch.tensor([[0.0, 0.0], [4.0, 0.0], [4.0, 4.0], [0.0, 4.0]])
    s = 4.0 * math.sqrt(2.0) - 4.0
    expected = 2 * (-4.0 * s**2 + 0.9 * s**4)
    assert dw4_energy(x).item() == pytest.approx(expected, rel=1e-12)
    # tau scales the energy, d0 moves the barrier: with d0 = 4 sqrt(2) only the sides count
    assert dw4_energy(x, tau=2.0).item() == pytest.approx(expected / 2, rel=1e-12)
    s = 4.0 - 4.0 * math.sqrt(2.0)
    side = 4 * (-4.0 * s**2 + 0.9 * s**4)
    assert dw4_energy(x, d0=4.0 * math.sqrt(2.0)).item() == pytest.approx(side, rel=1e-12)


def test_lj13_line_by_hand():
    # 13 particles on a line with spacing rm = 1: 12 - k unordered pairs at distance k + 1,
    # each counted twice; the harmonic term is 0.5 * sum_i (i - 6)^2 = 0.5 * 2 * (1+4+...+36)
    x = torch.zeros(13, 3)
    x[:, 0] = torch.arange(13.0) + 7.5  # the offset must not matter
    lj = sum(2 * (13 - k) * (k**-12 - 2 * k**-6) for k in range(1, 13))
    assert lj13_energy(x).item() == pytest.approx(lj + 0.5 * 182, rel=1e-12)
    assert lj13_energy(x, eps=2.0, harmonic=0.0).item() == pytest.approx(2 * lj, rel=1e-12)
    # rm = 2 with spacing 2 gives the same pair terms
    assert lj13_energy(2 * x, rm=2.0, harmonic=0.0).item() == pytest.approx(lj, rel=1e-12)


def test_lj13_single_pair_at_rm():
    # one pair at r = rm, all others >= 99 apart (their terms are < 1e-11): -eps per ordered
    # pair, so -2 eps in total
    x = torch.zeros(13, 3)
    x[:, 0] = 100.0 * torch.arange(13.0)
    x[1] = x[0] + torch.tensor([0.0, 0.6, 0.8])
    assert lj13_energy(x, eps=1.5, harmonic=0.0).item() == pytest.approx(-3.0, abs=1e-9)


def test_lj13_overlap_is_inf_not_nan():
    x = _lj13_config(1)[0]
    x[1] = x[0]
    u = lj13_energy(x)
    assert torch.isinf(u) and u > 0


@pytest.mark.parametrize("name", ["dw4", "lj13"])
def test_energy_invariances(name):
    system = SYSTEMS[name]
    x = 2.0 * torch.randn(5, 4, 2) if name == "dw4" else _lj13_config(5)
    u = system.energy(x)
    assert u.shape == (5,)
    Q = random_orthogonal(system.dim)  # a reflection: O(d), not only SO(d)
    shift = 3.0 * torch.randn(5, 1, system.dim)
    perm = torch.randperm(system.n_particles)
    for y in (x @ Q.T, x + shift, x[:, perm], (x[:, perm] @ Q.T) + shift):
        torch.testing.assert_close(system.energy(y), u, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["dw4", "lj13"])
def test_energy_gradient_matches_finite_differences(name):
    system = SYSTEMS[name]
    x = 2.0 * torch.randn(2, 4, 2) if name == "dw4" else _lj13_config(2)
    # gradcheck compares autograd with central differences in float64
    assert torch.autograd.gradcheck(system.energy, (x.requires_grad_(),), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", ["dw4", "lj13"])
def test_energy_float32_and_batch_shapes(name):
    system = SYSTEMS[name]
    x = 2.0 * torch.randn(2, 3, 4, 2) if name == "dw4" else _lj13_config(6).view(2, 3, 13, 3)
    u64 = system.energy(x)
    u32 = system.energy(x.float())
    assert u64.shape == (2, 3) and u32.dtype == torch.float32
    torch.testing.assert_close(u32.double(), u64, rtol=1e-4, atol=1e-4)
    assert system.energy(x[0, 0]).shape == ()


def test_energy_shape_validation():
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, 2\).*\(4, 3\)"):
        dw4_energy(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"\(\.\.\., 13, 3\)"):
        lj13_energy(torch.zeros(5, 39))
    with pytest.raises(ValueError, match="floating"):
        dw4_energy(torch.zeros(4, 2, dtype=torch.long))


def test_pair_distances_against_cdist():
    x = torch.randn(3, 6, 2)
    i, j = torch.triu_indices(6, 6, offset=1)
    full = torch.cdist(x, x)
    torch.testing.assert_close(pair_distances(x), full[:, i, j])
    torch.testing.assert_close(pair_distances(x, squared=True), full[:, i, j] ** 2)
    ordered = pair_distances(x, ordered=True)
    assert ordered.shape == (3, 30)
    torch.testing.assert_close(ordered.sum(-1), full.sum((-2, -1)))


def test_systems_registry():
    assert get_system("DW4") is SYSTEMS["dw4"]
    lj = get_system("lj13")
    assert isinstance(lj, ParticleSystem) and (lj.n_particles, lj.dim, lj.flat_dim) == (13, 3, 39)
    lj55 = get_system("lj55")
    assert (lj55.n_particles, lj55.dim, lj55.energy) == (55, 3, lj55_energy)
    with pytest.raises(ValueError, match="dw4.*lj13.*lj55"):
        get_system("lj38")


# ------------------------------------------------------------------ sampler
def _chain_means(samples: torch.Tensor, n_chains: int) -> torch.Tensor:
    # rows are (time, chain): per-chain averages are independent, so their spread gives an
    # honest standard error despite the autocorrelation inside each chain
    return samples.reshape(-1, n_chains, *samples.shape[1:]).mean(0)


@pytest.mark.parametrize("method", ["rwm", "mala"])
def test_double_well_stationary_statistics(method):
    # U(x) = (x^2 - 1)^2: exact moments by quadrature
    grid = np.linspace(-4.0, 4.0, 200_001)
    density = np.exp(-((grid**2 - 1.0) ** 2))
    z = np.trapezoid(density, grid)
    exact_x2 = np.trapezoid(grid**2 * density, grid) / z
    exact_pos = np.trapezoid(density * (grid > 0), grid) / z

    C = 1000
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(C, 1, generator=gen)
    energy = lambda x: (x[:, 0] ** 2 - 1.0) ** 2
    samples, stats = sample_mcmc(
        energy, x0, 20 * C, method=method, step=0.5, burn_in=300, thin=5, generator=gen
    )
    assert samples.shape == (20 * C, 1) and samples.dtype == torch.float64
    target = 0.574 if method == "mala" else 0.234
    assert stats["acceptance"] == pytest.approx(target, abs=0.05)
    assert stats["n_chains"] == C and stats["steps"] == 300 + 20 * 5

    x2 = _chain_means(samples[:, 0] ** 2, C)
    pos = _chain_means((samples[:, 0] > 0).double(), C)
    assert x2.mean().item() == pytest.approx(exact_x2, abs=mc_tolerance(x2))
    assert pos.mean().item() == pytest.approx(exact_pos, abs=mc_tolerance(pos))


@pytest.mark.parametrize(("method", "adapt", "step"), [("rwm", True, 1.0), ("mala", False, 0.5)])
def test_gaussian_mean_and_covariance(method, adapt, step):
    # non-adaptive MALA with a large step: the unadjusted Langevin chain would have variance
    # 1 / (1 - h / 2) = 4/3, so this checks the Hastings correction of the proposal
    C = 1000
    gen = torch.Generator().manual_seed(2)
    energy = lambda x: 0.5 * x.square().sum(-1)
    samples, _ = sample_mcmc(
        energy, torch.randn(C, 2, generator=gen), 20 * C, method=method, step=step,
        burn_in=200, thin=5, adapt=adapt, generator=gen,
    )  # fmt: skip
    mean = _chain_means(samples, C)
    outer = _chain_means(samples[:, :, None] * samples[:, None, :], C).reshape(C, 4)
    eye = torch.eye(2).reshape(4)
    for k in range(2):
        assert mean[:, k].mean().item() == pytest.approx(0.0, abs=mc_tolerance(mean[:, k]))
    for k in range(4):
        tol = mc_tolerance(outer[:, k])
        assert outer[:, k].mean().item() == pytest.approx(eye[k].item(), abs=tol)


def test_ordering_and_truncation():
    # 3 chains that never move (all proposals rejected): row t * C + c is chain c
    energy = lambda x: torch.where(x.abs().sum(-1) < 1e-12, 0.0, math.inf)
    x0 = torch.zeros(3, 1)
    samples, stats = sample_mcmc(energy, x0, 7, method="rwm", burn_in=2, thin=3, adapt=False)
    assert samples.shape == (7, 1) and stats["acceptance"] == 0.0
    assert stats["steps"] == 2 + 3 * 3  # ceil(7 / 3) kept states per chain
    x0 = torch.arange(3.0)[:, None]
    energy = lambda x: torch.where(torch.isin(x[:, 0], x0[:, 0]), 0.0, math.inf)
    samples, _ = sample_mcmc(energy, x0, 7, method="rwm", burn_in=0, thin=2)
    assert samples[:, 0].tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0]


@pytest.mark.parametrize("method", ["rwm", "mala"])
def test_non_finite_proposals_are_rejected(method):
    # a hard wall at |x| = 1: energies outside are +inf (and NaN far out)
    def energy(x):
        u = torch.where(x[:, 0].abs() < 1.0, 0.5 * x[:, 0] ** 2, math.inf)
        return torch.where(x[:, 0].abs() > 3.0, math.nan, u)

    gen = torch.Generator().manual_seed(3)
    samples, _ = sample_mcmc(
        energy, torch.zeros(200, 1), 2000, method=method, step=2.0, burn_in=50, generator=gen
    )
    assert torch.isfinite(samples).all() and (samples.abs() < 1.0).all()


def test_seeded_generator_is_deterministic():
    energy = lambda x: (x[:, 0] ** 2 - 1.0) ** 2 + 0.5 * x[:, 1] ** 2
    x0 = torch.zeros(10, 2)

    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return sample_mcmc(energy, x0, 100, burn_in=20, thin=2, generator=gen)

    (a, sa), (b, sb), (c, _) = run(0), run(0), run(1)
    assert torch.equal(a, b) and sa == sb
    assert not torch.equal(a, c)


def test_sampler_input_validation():
    energy = lambda x: 0.5 * x.square().sum(-1)
    x0 = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="method"):
        sample_mcmc(energy, x0, 10, method="hmc")
    with pytest.raises(ValueError, match="thin"):
        sample_mcmc(energy, x0, 10, thin=0)
    with pytest.raises(ValueError, match="n_samples"):
        sample_mcmc(energy, x0, 0)
    with pytest.raises(ValueError, match="burn_in"):
        sample_mcmc(energy, x0, 10, burn_in=-1)
    with pytest.raises(ValueError, match="step"):
        sample_mcmc(energy, x0, 10, step=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        sample_mcmc(energy, torch.full((4, 2), math.nan), 10)
    with pytest.raises(ValueError, match=r"\(C,\)"):
        sample_mcmc(lambda x: x.sum(), x0, 10)


def test_progress_bar_runs(capsys):
    energy = lambda x: 0.5 * x.square().sum(-1)
    sample_mcmc(energy, torch.zeros(4, 2), 8, burn_in=5, thin=1, progress=True, desc="test")
    assert "test" in capsys.readouterr().err


# ------------------------------------------------------------------ datasets
@pytest.mark.parametrize("name", ["dw4", "lj13"])
def test_make_dataset_small(name):
    system = SYSTEMS[name]
    x, stats = make_dataset(name, 200, seed=4, n_chains=50, burn_in=100, thin=2, progress=False)
    assert x.shape == (200, system.flat_dim) and x.dtype == np.float32
    assert np.isfinite(x).all()
    u = system.energy(torch.from_numpy(x).view(200, system.n_particles, system.dim))
    assert torch.isfinite(u).all()
    assert stats["system"] == name and stats["n_chains"] == 50 and stats["thin"] == 2
    again, _ = make_dataset(name, 200, seed=4, n_chains=50, burn_in=100, thin=2, progress=False)
    np.testing.assert_array_equal(x, again)


def test_make_dataset_lj13_starts_without_overlaps():
    x, _ = make_dataset("lj13", 100, n_chains=100, burn_in=0, thin=1, progress=False)
    assert pair_distances(torch.from_numpy(x).view(100, 13, 3)).min() > 0.5


def test_save_dataset(tmp_path):
    path = tmp_path / "sub" / "dw4.npy"
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert save_dataset(array, path) == path
    np.testing.assert_array_equal(np.load(path), array)
    with pytest.raises(FileExistsError):
        save_dataset(array, path)
    save_dataset(2 * array, path, overwrite=True)
    np.testing.assert_array_equal(np.load(path), 2 * array)
