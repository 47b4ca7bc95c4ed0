"""Boltzmann reweighting: `boltzmann_weights` / `ess_fraction` against closed forms, failed
energies, and `grassflow.tasks.reweight` (``grassflow sample --reweight mmff``) end to end."""

import dataclasses
import json
import math
import sys

import numpy as np
import pytest
import torch

from grassflow.cli import main
from grassflow.metrics.boltzmann import boltzmann_weights, ess_fraction

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# ------------------------------------------------------------------ closed form
def _moment(k: int, d: int, s_q: float, s_p: float) -> float:
    """``E_q[(p/q)^k]`` for ``q = N(0, s_q^2 I_d)``, ``p = N(0, s_p^2 I_d)`` (normalized).

    Per dimension ``p^k q^(1-k)`` is an unnormalized Gaussian of precision
    ``a_k = k / s_p^2 - (k - 1) / s_q^2``, whose integral is ``s_p^-k s_q^(k-1) a_k^(-1/2)``;
    for k = 2 that is ``s_q^2 / (s_p sqrt(2 s_q^2 - s_p^2))``. Dimensions multiply.
    """
    a = k / s_p**2 - (k - 1) / s_q**2
    assert a > 0, "the moment is infinite"
    return (s_p**-k * s_q ** (k - 1) / math.sqrt(a)) ** d


def _closed_form(N: int, d: int, s_q: float, s_p: float) -> dict:
    """The limits of the weighted mean of ``|x|^2`` and of the ESS fraction, and their
    asymptotic standard errors at ``N`` samples (from the closed-form moments, so that the
    tolerance does not depend on the weights under test).

    - ``mu = sum w |x|^2 -> d s_p^2``; its variance is ``E_q[u^2 (|x|^2 - mu)^2] / N`` with
      ``u = p/q``; ``u^2 q = R2 N(0, v I)``, ``v = 1 / (2 / s_p^2 - 1 / s_q^2)``, and
      ``|x|^2`` under ``N(0, v I)`` has mean ``d v`` and variance ``2 d v^2``.
    - ``ESS / N = mean(u)^2 / mean(u^2) -> 1 / R2``; delta method with
      ``Var u = R2 - 1``, ``Var u^2 = R4 - R2^2``, ``Cov(u, u^2) = R3 - R2``.
    """
    R2, R3, R4 = (_moment(k, d, s_q, s_p) for k in (2, 3, 4))
    v = 1.0 / (2.0 / s_p**2 - 1.0 / s_q**2)
    mu = d * s_p**2
    cov = np.array([[R2 - 1, R3 - R2], [R3 - R2, R4 - R2**2]])
    grad = np.array([2.0 / R2, -1.0 / R2**2])  # of m1^2 / m2 at (1, R2)
    return {"mu": mu, "mu_se": math.sqrt(R2 * (2 * d * v**2 + (d * v - mu) ** 2) / N),
            "ess": 1.0 / R2, "ess_se": math.sqrt(grad @ cov @ grad / N)}  # fmt: skip


def _gaussian_samples(N, d, s_q, s_p, kT, seed=0):
    """``|x|^2``, energies ``E = kT |x|^2 / (2 s_p^2)`` and exact ``log q`` of N draws of q."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, s_q, (N, d))
    r2 = (x**2).sum(1)
    log_q = -0.5 * r2 / s_q**2 - d * math.log(s_q * math.sqrt(2 * math.pi))
    return r2, kT * r2 / (2 * s_p**2), log_q


@pytest.mark.parametrize("d, s_q, s_p, kT", [(3, 1.2, 1.0, 0.596), (1, 0.95, 1.0, 2.5),
                                             (2, 1.0, 0.7, 1.0)])  # fmt: skip
def test_wrong_kT_or_sign_of_the_weights_misses_the_gaussian_target(d, s_q, s_p, kT):
    # catches: weights exp(-E/kT) with a wrong kT factor (kT omitted, E / (2 kT)), a wrong
    # sign (exp(+E/kT)), log q added instead of subtracted, and an ESS that is not the Kish
    # fraction (e.g. not divided by N, or 1/sum w^2 of unnormalized weights). The weighted
    # mean of |x|^2 must be d s_p^2 and ESS/N -> 1 / E_q[(p/q)^2], within 4.5 asymptotic SEs
    N = 20_000
    r2, E, log_q = _gaussian_samples(N, d, s_q, s_p, kT)
    want = _closed_form(N, d, s_q, s_p)

    def misses(w) -> tuple[bool, bool]:
        return (abs(w @ r2 - want["mu"]) > 4.5 * want["mu_se"],
                abs(ess_fraction(w) - want["ess"]) > 4.5 * want["ess_se"])  # fmt: skip

    w, n_zero = boltzmann_weights(E, log_q, kT)
    assert n_zero == 0 and w.sum() == pytest.approx(1.0, abs=1e-12) and (w > 0).all()
    assert misses(w) == (False, False)
    # the power guard: the same check fails for the bugs it is there for
    for bad in (2 * kT, 0.5 * kT):
        assert misses(boltzmann_weights(E, log_q, bad)[0]) == (True, True)
    assert any(misses(boltzmann_weights(-E, log_q, kT)[0]))
    assert any(misses(boltzmann_weights(E, -log_q, kT)[0]))


def test_ess_fraction_is_kish_over_all_samples():
    # catches: an ESS count instead of a fraction and an ESS that drops zero weights from N
    assert ess_fraction(np.full(7, 3.0)) == pytest.approx(1.0, rel=1e-12)
    assert ess_fraction(np.eye(5)[2]) == pytest.approx(1 / 5, rel=1e-12)
    w = np.array([0.5, 0.25, 0.25, 0.0])
    assert ess_fraction(w) == pytest.approx(1.0 / (4 * np.sum(w**2)), rel=1e-12)
    for bad in ([], [1.0, -0.1], [1.0, math.nan], [0.0, 0.0]):
        with pytest.raises(ValueError):
            ess_fraction(np.array(bad))


# ------------------------------------------------------------------ failed energies
def test_a_failed_energy_gets_weight_zero_counts_and_stays_in_the_ess():
    # catches: a NaN or +inf energy that poisons every weight (NaN), raises, or is dropped
    # from N in the ESS; and a failed sample's undefined log q read at all
    E = np.array([1.0, math.inf, math.nan, 2.0, 3.0])
    log_q = np.array([0.0, math.nan, -math.inf, 0.5, 0.0])
    w, n_zero = boltzmann_weights(E, log_q, 1.0)
    assert n_zero == 2 and w[1] == 0.0 and w[2] == 0.0
    raw = np.exp(-np.array([1.0, 2.0, 3.0]) - np.array([0.0, 0.5, 0.0]))
    assert w[[0, 3, 4]] == pytest.approx(raw / raw.sum(), rel=1e-12)
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    assert ess_fraction(w) == pytest.approx(1.0 / (5 * np.sum(w**2)), rel=1e-12)
    assert ess_fraction(w) < 1.0 / (3 * np.sum(w**2))  # the 3 finite ones alone: larger
    # huge energies underflow exp(-E/kT) without an error (log space)
    w, _ = boltzmann_weights(np.array([1e6, 1e6 + 1.0]), np.zeros(2), 0.596)
    assert w == pytest.approx([1 / (1 + math.exp(-1 / 0.596)), 1 / (1 + math.exp(1 / 0.596))])


@pytest.mark.parametrize("E, log_q, kT, match", [
    ([math.inf, math.nan], [0.0, 0.0], 1.0, "non-finite"),
    ([1.0, 2.0], [0.0, math.nan], 1.0, "NaN"),
    ([1.0, 2.0], [0.0], 1.0, "equal shape"),
    ([1.0], [0.0], 0.0, "kT"),
    ([1.0], [0.0], math.inf, "kT"),
])  # fmt: skip
def test_bad_weights_input_is_named(E, log_q, kT, match):
    # catches: silently returning NaN weights for no usable sample, a NaN log q where it
    # matters, mismatched arrays, or a non-physical kT
    with pytest.raises(ValueError, match=match):
        boltzmann_weights(np.array(E), np.array(log_q), kT)


def test_plots_refuse_weights_that_are_not_one_per_sample(tmp_path):
    # catches: weights of another draw (another length) or negative ones silently drawn
    from grassflow.viz.conformer_plots import plot_conformer_energies, plot_torsions

    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 4, 3))
    quads = np.array([[0, 1, 2, 3]])
    for w in (np.ones(5), -np.ones(6), np.zeros(6)):
        with pytest.raises(ValueError, match="weights"):
            plot_torsions(X, X, quads, tmp_path / "t.png", weights=w)
        with pytest.raises(ValueError, match="weights"):
            plot_conformer_energies(np.arange(6.0), np.arange(3.0), tmp_path / "e.png", weights=w)
    w = np.array([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    assert plot_torsions(X, X, quads, tmp_path / "t.png", weights=w).stat().st_size > 0
    E = np.array([1.0, 2.0, 500.0, math.inf, 1.5, 2.5])
    assert plot_conformer_energies(E, np.arange(3.0), tmp_path / "e.png",
                                   weights=w).stat().st_size > 0  # fmt: skip


# ------------------------------------------------------------------ reweight end to end
SMALL = {"n_chains": 4, "burn_in": 300, "thin": 10}  # ethanol, 9 atoms: well under a second


@pytest.fixture(scope="module")
def ethanol_npz(tmp_path_factory):
    pytest.importorskip("rdkit")
    from grassflow.data import conformers

    path = tmp_path_factory.mktemp("data") / "ethanol.npz"
    conformers.save_ensemble(path, conformers.conformer_ensemble("CCO", 60, seed=0, **SMALL))
    return path


class StubModel:
    """A model of one conformer: ``x_0 +`` isotropic noise ``sigma`` on the centred cloud,
    with the Gaussian's log-density; sample 1 has two coincident atoms (MMFF fails)."""

    def __init__(self, x0: np.ndarray, sigma: float = 0.01):
        self.x0, self.sigma, self.seeds = torch.as_tensor(x0 - x0.mean(0)), sigma, []

    def sample_with_log_prob(self, m, generator=None):
        self.seeds.append(generator.initial_seed())
        noise = torch.randn(m, *self.x0.shape, generator=generator) * self.sigma
        noise = noise - noise.mean(1, keepdim=True)
        X = self.x0 + noise
        X[1, 1] = X[1, 0]
        X = X - X.mean(1, keepdim=True)
        dof = (self.x0.shape[0] - 1) * 3
        log_q = -0.5 * (noise**2).sum((1, 2)) / self.sigma**2 \
            - dof * math.log(self.sigma * math.sqrt(2 * math.pi))  # fmt: skip
        return X, log_q


@pytest.fixture
def stub_run(tmp_path, ethanol_npz, monkeypatch):
    """A run directory of kind ``shapes`` on the ethanol data whose model is `StubModel`."""
    from grassflow.tasks import reweight as rw
    from grassflow.tasks import shape_runs as shapes

    exp = shapes.ShapeExperiment(data=str(ethanol_npz), n_points=9, dim=3)
    splits = shapes.load_clouds(exp)
    exp.labels, exp.bonds, exp.bond_orders = (splits["labels"], splits["bonds"],
                                              splits["bond_orders"])  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").write_text(json.dumps({"kind": "shapes", **exp.to_dict()}))
    (run / "molecule.mol").write_text(splits["molblock"])
    model = StubModel(splits["train"][0].numpy())
    monkeypatch.setattr(rw, "load_run", lambda run_dir: (exp, model))
    return run, model, splits


def test_reweight_writes_weights_that_belong_to_the_written_samples(stub_run, tmp_path):
    # catches: weights that do not sum to one, are not the ones of the samples written (row
    # order, another draw), energies of other clouds, the data's temperature not read, a
    # failed MMFF energy that crashes instead of weighing 0, and files missing
    from grassflow.data.conformers import KB_KCAL
    from grassflow.metrics.chemistry import mmff_energies, template_from_molblock
    from grassflow.tasks.reweight import reweight, reweight_line

    run, model, splits = stub_run
    out = tmp_path / "gen" / "draws.npy"
    r = reweight(run, 24, seed=3, out=out)
    assert model.seeds == [3]
    stem = tmp_path / "gen" / "draws"
    for suffix in (".npy", "_Z.npy", ".xyz", ".sdf", "_weights.npy", "_weights.npz",
                   "_energies.png", "_torsions.png"):  # fmt: skip
        assert (tmp_path / "gen" / f"draws{suffix}").stat().st_size > 0, suffix
    X = np.load(out)
    w = np.load(f"{stem}_weights.npy")
    saved = np.load(f"{stem}_weights.npz")
    assert X.shape == (24, 9, 3) and w.shape == (24,)
    assert w.sum() == pytest.approx(1.0, abs=1e-12) and np.array_equal(saved["weights"], w)
    assert float(saved["temperature"]) == 300.0 == r["temperature"]
    assert r["temperature_from"] == "data" and float(saved["kT"]) == KB_KCAL * 300.0
    E = mmff_energies(template_from_molblock((run / "molecule.mol").read_text()), X)
    assert np.array_equal(saved["energies"], E)
    assert math.isinf(E[1]) and w[1] == 0.0 and r["n_zero_weight"] == 1
    assert np.isfinite(E[np.arange(24) != 1]).all()
    want, _ = boltzmann_weights(E, saved["log_q"], KB_KCAL * 300.0)
    assert w == pytest.approx(want, rel=1e-12)
    assert r["ess_fraction"] == pytest.approx(ess_fraction(w), rel=1e-12)
    assert r["ess"] == pytest.approx(24 * r["ess_fraction"])
    assert r["mean_energy_reweighted"] == pytest.approx(np.dot(w[w > 0], E[w > 0]))
    assert r["mean_energy_raw"] == pytest.approx(E[np.isfinite(E)].mean())
    assert r["n_test"] == len(splits["test"])
    line = reweight_line(r)
    assert "ESS" in line and "\n" not in line
    # the argument wins over the data's temperature
    r = reweight(run, 4, seed=3, temperature=600.0, out=out)
    assert r["temperature_from"] == "argument" and r["data_temperature"] == 300.0
    assert float(np.load(f"{stem}_weights.npz")["kT"]) == KB_KCAL * 600.0


def test_cli_sample_reweight_prints_the_ess_and_refuses_other_kinds(stub_run, tmp_path, capsys):
    # catches: --reweight ignored by `sample`, no ESS line, and a texture (or other) run
    # sent to the molecule reweighting, or --temperature silently ignored without --reweight
    run, _, _ = stub_run
    out = tmp_path / "cli.npy"
    argv = ["sample", str(run), "--n", "6", "--out", str(out), "--reweight", "mmff"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum("ESS" in line for line in lines) == 1 and "at 300 K" in lines[-1]
    assert np.load(tmp_path / "cli_weights.npy").sum() == pytest.approx(1.0)
    assert main([*argv, "--temperature", "500"]) == 0
    assert "at 500 K (--temperature)" in capsys.readouterr().out
    assert main(["sample", str(run), "--n", "6", "--out", str(out), "--temperature", "300"]) == 2
    assert "--reweight" in capsys.readouterr().err
    other = tmp_path / "textures"
    other.mkdir()
    (other / "experiment.json").write_text(json.dumps({"kind": "textures"}))
    assert main(["sample", str(other), "--n", "6", "--reweight", "mmff"]) == 2
    err = capsys.readouterr().err
    assert "kind 'textures'" in err and "--reweight" in err


def test_missing_molblock_temperature_or_rdkit_is_named(stub_run, tmp_path, monkeypatch):
    # catches: an AttributeError / KeyError deep inside instead of naming what is missing,
    # and minutes of sampling spent before the error (the stub records every draw)
    from grassflow.tasks import reweight as rw

    run, model, splits = stub_run
    monkeypatch.setitem(sys.modules, "rdkit", None)
    with pytest.raises(ImportError, match=r"grassflow\[molecules\]"):
        rw.reweight(run, 4)
    monkeypatch.delitem(sys.modules, "rdkit")
    exp, _ = rw.load_run(run)
    np.save(tmp_path / "plain.npy", splits["train"].numpy())  # a .npy keeps no temperature
    plain = dataclasses.replace(exp, data=str(tmp_path / "plain.npy"))
    monkeypatch.setattr(rw, "load_run", lambda run_dir: (plain, model))
    with pytest.raises(ValueError, match="--temperature"):
        rw.reweight(run, 4)
    assert model.seeds == []
    (run / "molecule.mol").unlink()
    with pytest.raises(FileNotFoundError, match="molecule.mol"):
        rw.reweight(run, 4, temperature=300.0)
    assert model.seeds == []


def test_a_trained_molecule_run_reweights_from_the_command_line(ethanol_npz, tmp_path, capsys):
    # catches: the real model's sample_with_log_prob not wired in (shapes, dtypes, the
    # generator argument) and a run's molecule.mol that MMFF cannot use: a run trained for a
    # few steps on ethanol, end to end through the CLI (~6 s, so not marked slow)
    run = tmp_path / "run"
    assert main(["train", "--data", str(ethanol_npz), "--run-dir", str(run), "--iterations",
                 "10", "--budget-minutes", "10", "--atol", "1e-4", "--rtol", "1e-4",
                 "--no-progress", "--no-eval"]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "gen.npy"
    assert main(["sample", str(run), "--n", "8", "--out", str(out), "--reweight", "mmff"]) == 0
    assert "ESS" in capsys.readouterr().out
    w = np.load(tmp_path / "gen_weights.npy")
    assert w.shape == (8,) and w.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.isfinite(np.load(tmp_path / "gen_weights.npz")["log_q"]).all()
    assert (tmp_path / "gen.sdf").exists() and (tmp_path / "gen_energies.png").exists()
