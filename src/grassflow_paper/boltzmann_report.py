"""Boltzmann-generator metrics of the vs-E-NF runs, the two-part model's and the baseline's alike.

For a trained run on DW4 or LJ13 (`vs_enf` or `efm`): the energies of
``n_samples`` model samples against those of the test configurations (histogram and
Wasserstein-1), and the Kish effective sample size of the importance weights
``exp(-U(x)) / q(x)`` of ``n_weighted`` samples with their exact log-density. U is the energy
that generated the Klein et al. files (`grassflow.data.particles`: LJ pairs counted
twice, ``results/lj_convention.md``) at temperature 1, and q the model's density on the
CoM-free coordinates, on which ``exp(-U)`` is the Boltzmann density too (U is translation
invariant). The same weights estimate log Z, hence ``boltzmann_test_nll``, the test NLL of
the Boltzmann density itself: the floor that no model of these files can beat (up to the
estimate's downward bias when the ESS is small). Writes ``boltzmann.json`` and
``energies.npz`` in the run directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from grassflow.data.particles import get_system
from grassflow.metrics import (
    effective_sample_size,
    energy_w1,
    finite_energies,
    log_importance_weights,
)
from grassflow.tasks.run_dir import training_status
from grassflow.training.checkpoint import write_json
from grassflow.training.clock import Stopwatch
from grassflow.viz.energies import plot_energy_histograms

from . import efm, vs_enf

__all__ = ["evaluate", "load_any", "plot"]


def load_any(run_dir: str | Path):
    """``(exp, model, module)`` of a two-part model (`vs_enf`) or baseline (`efm`) run."""
    preset = json.loads((Path(run_dir) / "experiment.json").read_text())
    module = efm if "coupling" in preset else vs_enf
    exp, model = module.load_run(run_dir)
    return exp, model, module


def _energies(system: str, X: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return get_system(system).energy(X.double()).numpy()


def evaluate(run_dir: str | Path, n_samples: int = 10_000, n_weighted: int = 1000,
             seed: int = 0, data: dict | None = None) -> dict:  # fmt: skip
    """Energy W1 and histogram data of ``n_samples`` samples, and the reweighting ESS of
    ``n_weighted`` samples, of the run's best checkpoint (see the module docs). The result is
    cached in ``boltzmann.json`` for the same checkpoint and sample sizes."""
    run_dir = Path(run_dir)
    exp, model, module = load_any(run_dir)
    status = training_status(run_dir / "flow")
    key = {"iterations": status["iterations"], "n_samples": n_samples,
           "n_weighted": n_weighted, "seed": seed}  # fmt: skip
    done = run_dir / "boltzmann.json"
    if done.exists() and all(json.loads(done.read_text()).get(k) == v for k, v in key.items()):
        return json.loads(done.read_text())
    data = vs_enf.load_enf_splits(exp.system, exp.n_train, exp.data_dir) if data is None else data
    gen = torch.Generator().manual_seed(seed)
    with Stopwatch() as sampling:
        X = model.sample(n_samples, gen)
    with torch.no_grad(), Stopwatch() as weighting:
        if module is efm:
            Xw, log_q = model.sample_with_log_prob(n_weighted, gen)
        else:
            Xw = model.sample(n_weighted, gen)
            log_q = torch.cat([model.log_prob(c) for c in Xw.split(64)])
    u_model, u_test = _energies(exp.system, X), _energies(exp.system, data["test"])
    u_val = _energies(exp.system, data["val"])
    finite, dropped = finite_energies(u_model)
    log_target, log_q = -torch.as_tensor(_energies(exp.system, Xw)), log_q.double()
    log_w, log_ratio = log_importance_weights(log_target, log_q), log_target - log_q
    # log Z = log E_q[exp(-U) / q] (an importance-sampling estimate, biased low when the ESS
    # is small), so E_test[U] + log Z is the test NLL of the Boltzmann density itself
    log_z = (torch.logsumexp(log_ratio, 0) - math.log(len(log_ratio))).item()
    result = {
        **key, "system": exp.system, "model": exp.model, "seed_run": exp.seed,
        "budget_minutes": exp.minutes, "energy_w1": energy_w1(finite, u_test),
        "energy_w1_floor": energy_w1(u_val, u_test), "n_infinite_energy": dropped,
        "energy_mean": float(finite.mean()), "energy_mean_test": float(u_test.mean()),
        "energy_median": float(np.median(finite)), "ess": effective_sample_size(log_w),
        "log_z": log_z, "boltzmann_test_nll": float(u_test.mean()) + log_z,
        "sample_cpu_minutes": sampling.cpu / 60, "weight_cpu_minutes": weighting.cpu / 60,
    }  # fmt: skip
    np.savez_compressed(run_dir / "energies.npz", model=u_model.astype(np.float32),
                        test=u_test.astype(np.float32))  # fmt: skip
    write_json(result, done)
    return result


def plot(system: str, runs: dict[str, str | Path], path: str | Path,
         limits: tuple[float, float] | None = None) -> Path:  # fmt: skip
    """Energy histograms of the samples of each run in ``runs`` (label -> run directory, each
    evaluated by `evaluate`) against the test configurations, in one PNG."""
    energies, test = {}, None
    for label, run_dir in runs.items():
        saved = np.load(Path(run_dir) / "energies.npz")
        energies[label], test = saved["model"], saved["test"]
    energies = {"test data": test, **energies}
    if limits is None:
        limits = tuple(np.quantile(test, [0.0, 1.0]) + np.array([-0.2, 1.0]) * np.ptp(test))
    plot_energy_histograms(energies, path, f"{system.upper()}: energy of samples vs test data",
                           limits=limits, log_density=True)  # fmt: skip
    return Path(path)
