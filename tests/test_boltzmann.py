"""Boltzmann-generator metrics (energy W1, importance weights, ESS), the LJ pair convention
and the energy-histogram figure."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from grassflow.data.mcmc import make_dataset
from grassflow.data.particles import lj13_energy, pair_distances
from grassflow.metrics import (
    effective_sample_size,
    energy_w1,
    finite_energies,
    log_importance_weights,
)
from grassflow.viz import plot_energy_histograms


# ------------------------------------------------------------------ energy W1
@pytest.mark.parametrize("sizes", [(200, 317), (1, 50), (1000, 1000)])
def test_w1_matches_scipy(sizes):
    # catches a wrong CDF step (side="left"), a missing 1/N normalisation of either CDF and
    # any assumption of equal sizes: scipy integrates the CDF difference independently
    rng = np.random.default_rng(0)
    u = rng.normal(0.0, 1.0, sizes[0])
    v = rng.gamma(2.0, 1.5, sizes[1])
    assert energy_w1(u, v) == pytest.approx(wasserstein_distance(u, v), rel=1e-12, abs=1e-12)
    assert energy_w1(v, u) == pytest.approx(energy_w1(u, v), rel=1e-12)


def test_w1_with_ties_and_tensors():
    # catches mishandled ties (repeated values make zero-length intervals) and tensors that
    # are not converted (or converted in float32)
    u = torch.tensor([0.0, 0.0, 1.0, 1.0, 3.0], dtype=torch.float64)
    v = np.array([1.0, 1.0, 2.0])
    assert energy_w1(u, v) == pytest.approx(wasserstein_distance(u.numpy(), v), rel=1e-12)


@pytest.mark.parametrize("c", [2.5, -0.75])
def test_w1_of_a_shift_is_the_shift(c):
    # catches a signed integral (sum of F_u - F_v instead of |F_u - F_v|) and a wrong
    # interval length: W1(x, x + c) = |c| exactly
    x = np.random.default_rng(1).normal(size=400)
    assert energy_w1(x, x + c) == pytest.approx(abs(c), rel=1e-10)
    assert energy_w1(x, x) == 0.0


@pytest.mark.parametrize(
    "bad, match",
    [([], "empty"), ([1.0, math.nan], "NaN"), ([1.0, math.inf], "infinite.*finite_energies")],
)
def test_w1_bad_input_raises(bad, match):
    # catches silently returning NaN/inf (or a number for an empty set) instead of telling
    # the caller which input is wrong
    with pytest.raises(ValueError, match=match):
        energy_w1(np.array(bad), np.ones(3))
    with pytest.raises(ValueError, match=match):
        energy_w1(np.ones(3), np.array(bad))


def test_finite_energies_drops_and_counts_inf():
    # catches dropping +inf silently (the count must be reported) and accepting -inf / NaN,
    # which no energy should ever be
    kept, dropped = finite_energies(torch.tensor([1.0, math.inf, -2.0, math.inf]))
    np.testing.assert_array_equal(kept, [1.0, -2.0])
    assert dropped == 2
    with pytest.raises(ValueError, match="-inf"):
        finite_energies([0.0, -math.inf])
    with pytest.raises(ValueError, match="NaN"):
        finite_energies([0.0, math.nan])


# ------------------------------------------------------------------ importance weights, ESS
def test_log_importance_weights_normalised():
    # catches a missing normalisation (logsumexp != 0), the sign of log q, and a zero weight
    # for log_target = -inf turning into NaN
    log_target = torch.tensor([-1.0, -2.0, -math.inf, 0.5], dtype=torch.float64)
    log_q = torch.tensor([-0.5, -3.0, -1.0, 0.0], dtype=torch.float64)
    log_w = log_importance_weights(log_target, log_q)
    assert torch.logsumexp(log_w, 0).item() == pytest.approx(0.0, abs=1e-14)
    w = (log_target - log_q).exp()
    torch.testing.assert_close(log_w.exp(), w / w.sum())
    assert log_w[2] == -math.inf


def test_log_importance_weights_bad_input_raises():
    # catches NaN weights, infinite weights and shape mismatches passing through silently
    ok = torch.zeros(3)
    with pytest.raises(ValueError, match="NaN"):
        log_importance_weights(torch.tensor([0.0, math.nan, 0.0]), ok)
    with pytest.raises(ValueError, match="log_q"):
        log_importance_weights(ok, torch.tensor([0.0, -math.inf, 0.0]))
    with pytest.raises(ValueError, match=r"\+inf"):
        log_importance_weights(torch.tensor([0.0, math.inf, 0.0]), ok)
    with pytest.raises(ValueError, match="all importance weights are zero"):
        log_importance_weights(torch.full((3,), -math.inf), ok)
    with pytest.raises(ValueError, match="equal shape"):
        log_importance_weights(ok, torch.zeros(4))


def test_ess_equal_weights_is_one():
    # catches a wrong power (sum w^2 / (sum w)^2) or a missing 1/N: ESS/N = 1 for any
    # common weight, however large (no overflow from exp)
    for c in (0.0, 800.0, -800.0):
        assert effective_sample_size(torch.full((1000,), c)) == pytest.approx(1.0, rel=1e-12)


def test_ess_single_weight_is_one_over_n():
    # catches zero weights (-inf) being rejected, or dropped from N
    log_w = torch.full((50,), -math.inf)
    log_w[7] = 3.0
    assert effective_sample_size(log_w) == pytest.approx(1 / 50, rel=1e-12)


def test_ess_lognormal_weights():
    # catches a wrong formula that still gives 1 and 1/N above (e.g. (sum w)^2 / sum w^2
    # with the wrong weights' exponent): for log w ~ N(0, s^2), ESS/N -> exp(-s^2); the
    # tolerance is 5 delta-method standard errors of A^2 / B (A = mean w, B = mean w^2)
    s, n = 0.6, 400_000
    gen = torch.Generator().manual_seed(0)
    log_w = s * torch.randn(n, generator=gen, dtype=torch.float64)
    m = [math.exp(k * k * s * s / 2) for k in range(5)]  # E[w^k] of a log-normal
    a, b = m[1], m[2]
    cov = np.array([[m[2] - a * a, m[3] - a * b], [m[3] - a * b, m[4] - b * b]]) / n
    grad = np.array([2 * a / b, -a * a / b**2])
    se = float(np.sqrt(grad @ cov @ grad))
    assert effective_sample_size(log_w) == pytest.approx(math.exp(-s * s), abs=5 * se)


@pytest.mark.parametrize(
    "bad, match",
    [([0.0, math.nan], "NaN"), ([0.0, math.inf], r"\+inf"), ([-math.inf] * 2, "all weights"),
     ([], "non-empty")],
)  # fmt: skip
def test_ess_bad_input_raises(bad, match):
    # catches NaN or infinite log weights producing a NaN "ESS" instead of an error
    with pytest.raises(ValueError, match=match):
        effective_sample_size(torch.tensor(bad, dtype=torch.float64))


# ------------------------------------------------------------------ LJ pair convention
def _lj13_config(batch: int = 4) -> torch.Tensor:
    # a perturbed 3x3x3 grid (spacing 1.1, 13 of its 27 sites): no two particles overlap
    gen = torch.Generator().manual_seed(3)
    grid = torch.stack(torch.meshgrid(*[torch.arange(3.0)] * 3, indexing="ij"), -1)
    sites = 1.1 * grid.reshape(27, 3).double()
    x = torch.stack([sites[torch.randperm(27, generator=gen)[:13]] for _ in range(batch)])
    return x + 0.1 * torch.randn(x.shape, generator=gen, dtype=x.dtype)


def test_lj13_unique_pairs_is_half_the_lj_part():
    # catches a convention switch that also scales the harmonic term, or counts pairs other
    # than once (unique) / twice (ordered); the harmonic term is checked by hand
    x = _lj13_config()
    centred = x - x.mean(-2, keepdim=True)
    harmonic = 0.5 * centred.square().sum((-2, -1))
    ordered = lj13_energy(x)
    unique = lj13_energy(x, pairs="unique")
    torch.testing.assert_close(lj13_energy(x, pairs="ordered"), ordered)  # default unchanged
    torch.testing.assert_close(unique - harmonic, (ordered - harmonic) / 2)
    r = pair_distances(x)
    torch.testing.assert_close(unique - harmonic, (r**-12 - 2 * r**-6).sum(-1))
    with pytest.raises(ValueError, match="unique"):
        lj13_energy(x, pairs="both")


# ------------------------------------------------------------------ figure
def test_plot_energy_histograms(tmp_path):
    # catches pyplot state (no Figure returned), a crash on +inf energies, and no file
    rng = np.random.default_rng(0)
    energies = {"data": rng.normal(-43, 4, 500),
                "model": torch.cat([torch.randn(300) - 40, torch.tensor([math.inf])])}  # fmt: skip
    path = tmp_path / "sub" / "energies.png"
    fig = plot_energy_histograms(energies, path, "LJ13", log_density=True)
    assert path.stat().st_size > 0
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["data", "model (1 non-finite)"]
    assert fig.axes[0].get_yscale() == "log"


def test_make_dataset_energy_override():
    # catches make_dataset ignoring its energy argument (the benchmark would then sample the
    # default convention twice)
    calls = []

    def energy(x):
        calls.append(x.shape)
        return lj13_energy(x, pairs="unique")

    x, _ = make_dataset("lj13", 20, seed=1, n_chains=20, burn_in=2, thin=1, energy=energy,
                        progress=False)  # fmt: skip
    assert calls and x.shape == (20, 39)
