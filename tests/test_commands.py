"""Smoke tests, with a known direction, of the commands whose numbers the README reports.

Each run is tiny and seeded, and ends by an iteration count: every training command gets a
generous wall-clock budget, so how much it trains does not depend on the machine's speed.
The margins were checked over several seeds (see each test) and are wide on purpose.
"""

import json
import math

import numpy as np
import pytest
import torch

from grassflow.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]

FAST = ["--no-progress", "--atol", "1e-3", "--rtol", "1e-3"]
# a budget far above the seconds these runs take: the iteration count ends training, and a
# dropped --iterations fails the test in minutes instead of hanging it
NO_CLOCK = ["--budget-minutes", "10"]
LOG_V_GR13 = math.log(2 * math.pi)  # uniform NLL on Gr(1,3)


def last_iteration(run_dir) -> int:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["iteration"]


def orthonormality_gap(Y: np.ndarray) -> float:
    """max |YᵀY - I| over a stack ``(n, D, k)``."""
    k = Y.shape[-1]
    return float(np.abs(np.swapaxes(Y, -1, -2) @ Y - np.eye(k)).max())


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`grassflow demo`: 40 MLE iterations on 2spirals at batch 100 (about 10 s)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    argv = ["demo", "--out", str(out), "--iterations", "40", "--batch-size", "100", *NO_CLOCK]
    assert main([*argv, *FAST]) == 0
    return out


def test_demo_beats_prior_and_uniform(demo_run):
    # catches: a sign error in the training loss, eval loading an untrained model, or the
    # demo stopped by its clock instead of --iterations
    r = json.loads((demo_run / "eval.json").read_text())
    assert last_iteration(demo_run) == 40
    assert r["uniform_nll"] == pytest.approx(LOG_V_GR13)
    assert r["prior_nll"] == pytest.approx(1.316, abs=1e-3)  # README table, a fixed number
    # --seed 0-4: test NLL 0.86-1.07 (s.e. <= 0.033) against 1.316 (prior), 1.838 (uniform)
    assert r["prior_nll"] - r["test_nll"] > max(0.1, 4 * r["test_nll_sem"])
    # samples moved from the prior towards the data: MMD² 0.009-0.023 against 0.037 (seeds 0-4)
    assert r["mmd2_model"] < 0.8 * r["mmd2_prior"]
    assert r["antipodal_max_dist"] < 1e-3  # a function of lines, not of unit vectors
    for name in ("textures.png", "antipodal.png", "prior.png"):
        assert (demo_run / name).stat().st_size > 10_000


def test_eval_rerun_is_exact(demo_run):
    # catches: unseeded randomness in evaluation (Hutchinson probes, MMD draws) or eval
    # reading a different checkpoint than the demo did
    from_demo = json.loads((demo_run / "eval.json").read_text())
    results = []
    for _ in range(2):
        assert main(["eval", str(demo_run)]) == 0
        results.append(json.loads((demo_run / "eval.json").read_text()))
    assert results[0] == results[1] == from_demo


def test_sample_is_on_the_manifold_with_its_density(demo_run, tmp_path):
    # catches: samples off Gr(1,3), a log-density of the wrong sign or of the prior
    # instead of the model, or a --seed that is ignored
    from grassflow.tasks.texture_runs import load_run

    paths = {name: tmp_path / f"{name}.npz" for name in ("a", "again", "other")}
    for name, seed in (("a", "3"), ("again", "3"), ("other", "4")):
        assert main(["sample", str(demo_run), "--n", "200", "--seed", seed,
                     "--out", str(paths[name])]) == 0  # fmt: skip
    a, again, other = (np.load(paths[name]) for name in ("a", "again", "other"))
    Y, logp = a["Y"], a["log_prob"]
    assert Y.shape == (200, 3, 1) and logp.shape == (200,) and np.isfinite(logp).all()
    assert orthonormality_gap(Y) < 1e-5
    assert np.array_equal(Y, again["Y"]) and np.array_equal(logp, again["log_prob"])
    assert not np.allclose(Y, other["Y"])
    # Gibbs: E_p[log p] >= -log V for every density p; here -0.94 to -0.59 (seeds 0-4)
    # against -1.838
    assert logp.mean() > -LOG_V_GR13 + 0.3
    # the saved log p is the model's density at the saved points, to solver tolerance
    # (atol = rtol = 1e-3: max gap 1e-4 to 5e-3 over seeds 0-4), not the prior's
    # (mean gap 0.44 to 1.0)
    _, model = load_run(demo_run)
    with torch.no_grad():
        model_logp = model.log_prob(torch.from_numpy(Y)).numpy()
        prior_logp = model.prior().log_prob(torch.from_numpy(Y)).numpy()
    assert np.abs(model_logp - logp).mean() < 1e-2
    assert np.abs(prior_logp - logp).mean() > 0.2


def test_reproduce_textures_figures_and_nll(tmp_path):
    # catches: --iterations not reaching the reproduced runs, a figure or table not written,
    # or the reproduced model no better than the uniform density
    out, runs = tmp_path / "out", tmp_path / "runs"
    argv = ["reproduce", "textures", "--datasets", "2sines", "--iterations", "40",
            "--batch-size", "100", "--budget-minutes-per-dataset", "10", "--preset", "paper",
            "--out", str(out), "--runs", str(runs)]  # fmt: skip
    assert main([*argv, *FAST]) == 0
    for name in ("figure3.png", "figure4.png", "prior.png"):
        assert (out / name).stat().st_size > 10_000
    (row,) = json.loads((out / "textures.json").read_text())
    assert row["dataset"] == "2sines" and row["iterations"] == 40
    assert last_iteration(runs / "2sines") == 40
    assert row["uniform_nll"] == pytest.approx(LOG_V_GR13)
    # --seed 0, 4, 5, 6: test NLL 0.96-1.44 (s.e. <= 0.036) against 1.662 (prior) and
    # 1.838 (uniform)
    assert row["uniform_nll"] - row["test_nll"] > max(0.2, 5 * row["test_nll_sem"])
    assert row["prior_nll"] - row["test_nll"] > 0.1
    assert f"{row['test_nll']:.3f} ± {row['test_nll_sem']:.3f}" in (out / "textures.md").read_text()
    preset = json.loads((runs / "2sines" / "experiment.json").read_text())
    assert (preset["objective"], preset["fourier_scale"]) == ("mle", None)  # the paper's


def test_texture_presets_reach_train_and_reproduce(tmp_path, monkeypatch):
    # catches: --preset parsed but ignored, a default that is not the documented fourier one,
    # or `train --preset fourier` inheriting the preset's budget-bound 10^6-iteration cap
    from grassflow.tasks import texture_runs as tx
    from grassflow_paper import textures_figures as fig

    seen = []
    monkeypatch.setattr(tx, "run", lambda exp, *a, **k: seen.append(exp) or TrainResultStub())
    monkeypatch.setattr(fig, "reproduce", lambda *a, base, **k: seen.append(base) or [])
    (tmp_path / "textures.md").write_text("")
    assert main(["train", "--dataset", "swissroll", "--run-dir", str(tmp_path / "r")]) == 0
    assert main(["train", "--dataset", "swissroll", "--run-dir", str(tmp_path / "r"),
                 "--preset", "paper"]) == 0  # fmt: skip
    assert main(["reproduce", "textures", "--out", str(tmp_path)]) == 0
    assert main(["reproduce", "textures", "--out", str(tmp_path), "--preset", "paper"]) == 0
    fourier, paper, rep_fourier, rep_paper = seen
    assert (fourier.dataset, fourier.objective, fourier.fourier_scale) == ("swissroll", "fm", 4.0)
    assert fourier.train.iterations == paper.train.iterations == 72_000
    assert (paper.objective, paper.fourier_scale, paper.hidden) == ("mle", None, (64, 64))
    assert rep_fourier.fourier_scale == 4.0 and rep_paper.fourier_scale is None
    assert rep_paper.train.batch_size == 200 and rep_paper.objective == "mle"


class TrainResultStub:
    message, stopped, iterations = "done", "iterations", 0


def test_particle_data_train_eval_sample(tmp_path, capsys):
    # catches: a particle run that learns nothing (or the wrong way), eval not reproducible,
    # or samples of the wrong shape or off Gr(2,4)
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["data", "make", "dw4", "--n", "2100", "--chains", "100", "--burn-in", "1000",
                 "--thin", "50", "--out", str(data), "--no-progress"]) == 0  # fmt: skip
    # FM on the paper protocol learns in a few steps; com-free gains only ~0.5 nats in
    # thousands (README), too slow for a smoke test
    assert main(["train", "--dataset", "dw4", "--protocol", "paper", "--n-train", "100",
                 "--data-dir", str(data), "--objective", "fm", "--prior", "uniform",
                 "--iterations", "100", "--run-dir", str(run), *NO_CLOCK, *FAST]) == 0  # fmt: skip
    assert last_iteration(run) == 100
    results = []
    for _ in range(2):
        assert main(["eval", str(run)]) == 0
        results.append(json.loads((run / "eval.json").read_text()))
    assert results[0] == results[1]
    r = results[0]
    assert (r["manifold"], r["n_test"]) == ("Gr(2,4)", 1000)
    assert r["uniform_nll"] == pytest.approx(2.983, abs=5e-4)
    assert r["prior_nll"] == pytest.approx(r["uniform_nll"])  # the prior is the uniform
    # --seed 0-4: test NLL 0.04-1.63 (s.e. <= 0.05) against 2.983
    assert r["uniform_nll"] - r["test_nll"] > max(0.5, 5 * r["test_nll_sem"])
    assert f"test NLL {r['test_nll']:.3f}" in capsys.readouterr().out

    out = tmp_path / "s.npz"
    assert main(["sample", str(run), "--n", "50", "--out", str(out)]) == 0
    saved = np.load(out)
    assert saved["Y"].shape == (50, 4, 2) and np.isfinite(saved["log_prob"]).all()
    assert orthonormality_gap(saved["Y"]) < 1e-5
