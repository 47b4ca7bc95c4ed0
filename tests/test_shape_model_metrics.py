"""Boltzmann-generator metrics and pictures of the shape-model runs
(grassflow_paper.boltzmann_report, grassflow_paper.vs_report), on stand-in models with known
samples and densities."""

import json
import math

import pytest
import torch
from scipy.stats import wasserstein_distance

from grassflow.data.particles import dw4_energy
from grassflow_paper import boltzmann_report as boltzmann
from grassflow_paper import efm, vs_report


class _Stub:
    """Known samples X and log-densities log_q."""

    def __init__(self, X, log_q):
        self.X, self.log_q = X, log_q

    def sample(self, n, generator=None):
        return self.X[:n]

    def sample_with_log_prob(self, n, generator=None):
        return self.X[:n], self.log_q[:n]


def test_boltzmann_metrics_recomputed_independently(tmp_path, monkeypatch):
    # bug caught: importance weights with the wrong sign of U or of log q, a log Z that is
    # not a mean over the samples, or an energy W1 against the wrong rows
    X, log_q = 2.0 * torch.randn(300, 4, 2), torch.randn(300) - 10.0
    exp = efm.EFMExperiment(system="dw4")
    monkeypatch.setattr(boltzmann, "load_any", lambda d: (exp, _Stub(X, log_q), efm))
    monkeypatch.setattr(boltzmann, "training_status", lambda d: {"iterations": 7})
    data = {"test": 2.0 * torch.randn(80, 4, 2), "val": 2.0 * torch.randn(60, 4, 2)}
    r = boltzmann.evaluate(tmp_path, n_samples=300, n_weighted=300, data=data)
    U = dw4_energy(X.double())
    log_ratio = -U - log_q.double()
    assert r["log_z"] == pytest.approx((torch.logsumexp(log_ratio, 0) - math.log(300)).item())
    w = torch.softmax(log_ratio, 0)
    assert r["ess"] == pytest.approx((1 / (300 * w.square().sum())).item())
    U_test = dw4_energy(data["test"].double())
    assert r["energy_w1"] == pytest.approx(wasserstein_distance(U.numpy(), U_test.numpy()))
    assert r["boltzmann_test_nll"] == pytest.approx(U_test.mean().item() + r["log_z"])
    # cached for the same checkpoint and sizes, recomputed for other sizes
    monkeypatch.setattr(boltzmann, "load_any", lambda d: (exp, _Stub(X * 0, log_q), efm))
    assert boltzmann.evaluate(tmp_path, n_samples=300, n_weighted=300, data=data) == r
    assert boltzmann.evaluate(tmp_path, n_samples=200, n_weighted=300, data=data) != r


def test_budget_plot_reads_trained_rows(tmp_path):
    # bug caught: a plot that drops a model's rows or crashes on anchors without budgets
    rows = [{"system": "dw4", "model": "m", "n_train": 1000, "seed": s, "budget_minutes": b,
             "train_cpu_minutes": b, "test_nll": 8.0 - b / 10 + s / 100}
            for s in range(3) for b in (7, 20)]  # fmt: skip
    rows += [{"system": "dw4", "model": "EFM (paper), normalized", "n_train": 1000,
              "budget_minutes": None, "test_nll": 7.19, "source": "issue 14"},
             {"system": "dw4", "model": "E-NF", "n_train": 1000, "budget_minutes": 7,
              "test_nll": 7.92, "source": "issue 14"}]  # fmt: skip
    path = vs_report.plot_test_nll(rows, "dw4", tmp_path / "b.png")
    assert path.stat().st_size > 1000
    (tmp_path / "flow").mkdir()
    (tmp_path / "flow" / "metrics.jsonl").write_text(
        "\n".join(json.dumps({"iteration": i, "elapsed": 6.0 * i, "cpu_s": 6.0 * i,
                              "val_nll": 9.0 - i}) for i in (1, 2, 4)))  # fmt: skip
    assert vs_report.plot_validation_curves({"m": tmp_path / "flow"}, tmp_path / "v.png").exists()
