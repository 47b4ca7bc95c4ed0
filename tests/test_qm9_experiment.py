"""QM9 experiment end to end on a tiny budget (needs qm9pack, in the test extra)."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist

from grassflow.data import qm9 as qm9data
from grassflow.distributions.cartesian import cartesian_log_prob_gram
from grassflow.manifolds.shape_space import helmert_basis
from grassflow.nn.graph import GraphPotential
from grassflow.tasks.run_dir import read_preset
from grassflow.tasks.run_dir import test_subset as seeded_rows  # not collected as a test
from grassflow.training import read_metrics
from grassflow_paper import qm9_report
from grassflow_paper import qm9_runs as qm9
from grassflow_paper.two_part import TwoPartShapeFlow

try:
    qm9data.qm9pack_data_dir()
except ImportError:
    pytest.skip("qm9pack is not installed (pip install -e '.[qm9]')", allow_module_level=True)

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]


def jsd_by_hand(X, Z, eps=1e-10):
    """E-NF's distance JSD written out with scipy: pdist, 100 bins on [0, 13] Å with the
    overflow in the last bin, eps-smoothed, and scipy's Jensen-Shannon distance squared."""

    def hist(P):
        d = np.concatenate([pdist(m) for m in P])
        d = d[d > 0]
        counts = np.histogram(np.minimum(d, 13.0 - 1e-9), bins=100, range=(0.0, 13.0))[0]
        p = counts / counts.sum() + eps
        return p / p.sum()

    return jensenshannon(hist(X), hist(Z)) ** 2


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One processed QM9 split for the module (its location is not part of a run's identity)."""
    path = tmp_path_factory.mktemp("qm9cache")
    qm9.load_molecules(path)
    return str(path)


def exact_log_prob(models, X):
    """The exact model's log-density written out with the Gram form of the Cartesian density,
    from the run's flow and Gram density (not through TwoPartShapeFlow.log_prob)."""
    P = helmert_basis(19).mT @ (X - X.mean(dim=-2, keepdim=True))
    with torch.no_grad():
        return cartesian_log_prob_gram(P, models.flow.log_prob, models.shape.gram.log_prob)


def test_reproduce_table2_tiny(tmp_path, cache_dir, fixed_pace):
    fixed_pace(0.35)  # a 3 s budget: 8 steps, 2.8 s
    exp = qm9.QM9Experiment(flow_minutes=0.05, scale_minutes=0.05, n_val=16, n_test=24,
                            cache_dir=cache_dir, atol=1e-4, rtol=1e-4)  # fmt: skip
    assert exp.potential == "mlp"  # the paper's potential is the default
    out, runs = tmp_path / "out", tmp_path / "runs"
    r = qm9_report.reproduce(out, runs, exp, progress=False, n_samples=40,
                             summary_dir=tmp_path / "summary")  # fmt: skip
    assert r["n_test"] == 24 and math.isfinite(r["test_nll"]) and r["potential"] == "mlp"
    # the exact NLL is the sum of its parts
    parts = r["test_nll_grassmann"] + r["test_nll_gram"] + r["mean_log_jacobian"]
    assert r["test_nll"] == pytest.approx(parts, rel=1e-9)
    # ... and it is the NLL of the run's TwoPartShapeFlow, written out independently
    _, models = qm9.load_run(runs)
    assert isinstance(models.shape, TwoPartShapeFlow) and models.flow is models.shape.flow
    # the seeded draw of n_test molecules (a prefix of the composition-ordered split is biased)
    test = seeded_rows(qm9.load_molecules(cache_dir)["test"], 24)
    # (to the ODE's tolerance: here the flow solves all 24 at once, the two-part model in
    # chunks of 16)
    assert -exact_log_prob(models, test).mean().item() == pytest.approx(r["test_nll"], abs=1e-3)
    # catches: evaluating an untrained part (the loaded Gram density is the trained one)
    best = torch.load(runs / "gram" / "best.pt", weights_only=False)["model"]
    untrained = qm9._models(exp).shape.gram.state_dict()
    for key, value in models.shape.gram.state_dict().items():
        assert torch.equal(value, best[f"gram.{key}"].double())
    assert any(not torch.equal(untrained[k], best[f"gram.{k}"].double()) for k in untrained)
    # the paper's model: NLL <= IWAE bound <= -ELBO (up to the Monte Carlo noise)
    assert math.isfinite(r["paper_neg_elbo"]) and r["paper_nll_iwae"] <= r["paper_neg_elbo"]
    assert 0 < r["paper_jsd"] <= math.log(2)
    assert np.load(runs / "samples_paper.npy").shape == (40, 19, 3)
    # catches: a JSD on the wrong histograms, bins or pairs (compared with scipy's, by hand)
    train = qm9.load_molecules(cache_dir)["train"].numpy()
    assert r["jsd"] == pytest.approx(jsd_by_hand(np.load(runs / "samples.npy"), train), rel=1e-6)
    assert r["paper_jsd"] == pytest.approx(
        jsd_by_hand(np.load(runs / "samples_paper.npy"), train), rel=1e-6
    )
    # catches: a broken-molecule fraction missing, or not of the saved samples (brute force
    # over atom pairs; the saved samples are float32, so one molecule at the 0.9 Å edge may
    # flip: a slack of one in 40)
    for key, name in (("broken_fraction", "samples.npy"),
                      ("paper_broken_fraction", "samples_paper.npy")):  # fmt: skip
        S = np.load(runs / name).astype(np.float64)
        brute = np.mean([min(np.linalg.norm(m[a] - m[b]) for a in range(19) for b in range(a))
                         < 0.9 for m in S])  # fmt: skip
        assert r[key] == pytest.approx(brute, abs=1 / 40 + 1e-12)
    # catches: the Gram-only diagnostic missing (test spans, sampled S)
    assert 0 <= r["given_spans_broken_fraction"] <= 1 and 0 < r["given_spans_jsd"] <= math.log(2)
    # 24 test molecules are closer to the training set than either model's samples after 8 steps
    assert 0 <= r["jsd_test_data"] < min(0.02, r["jsd"], r["paper_jsd"])
    assert json.loads((out / "table2.json").read_text()) == r
    # catches: the curve not read from the flow's validation records (its last point is the
    # best checkpoint's or later: the budget ends after the last validation)
    vals = [m["val_nll"] for m in read_metrics(runs / "flow" / "metrics.jsonl") if "val_nll" in m]
    assert [v for _, v in r["curve"]] == vals and (out / "curve.png").stat().st_size > 10_000
    # catches: the issue-14 summary row missing, or not this run's exact-model figures
    rows = json.loads((tmp_path / "summary" / "vs_enf.json").read_text())
    (row,) = [x for x in rows if x["model"].startswith("grassflow")]
    assert row["system"] == "qm9" and row["model"] == "grassflow-mlp-fm"
    assert (row["test_nll"], row["jsd"], row["broken_fraction"], row["n_test"]) == (
        r["test_nll"], r["jsd"], r["broken_fraction"], 24)
    assert row["n_train"] == len(qm9.load_molecules(cache_dir)["train"])
    assert row["budget_minutes"] == pytest.approx(0.1) and row["iterations"] == 8
    assert row["train_minutes"] == pytest.approx(r["flow_minutes"] + r["gram_minutes"])
    summary = (tmp_path / "summary" / "vs_enf" / "qm9.md").read_text()
    for text in ("-70.20", "-136.30", "not comparable", f"{r['jsd']:.4f}", "0.0060"):
        assert text in summary
    table = (out / "table2.md").read_text()
    assert "-70.2" in table and "ShapeFlow" in table and "mlp potential" in table
    assert (out / "distances.png").stat().st_size > 10_000
    assert (out / "figure5.png").stat().st_size > 10_000 and len(r["figure5_rmsd"]) == 4
    xyz = (out / "samples.xyz").read_text().splitlines()
    assert xyz[0] == "19" and len(xyz) == 10 * 21 and xyz[2].startswith("X ")
    # generated molecules are centred 19-atom configurations
    X = np.load(runs / "samples.npy")
    assert X.shape == (40, 19, 3) and np.abs(X.mean(axis=1)).max() < 1e-4
    subs = ("flow", "gram", "decoder")
    assert sorted(p.name for p in runs.iterdir() if p.is_dir()) == sorted(subs)
    for sub in subs:
        assert r[f"{sub}_iterations"] == 8 and r[f"{sub}_minutes"] == pytest.approx(2.8 / 60)
        assert qm9.training_status(runs / sub)["spent_total_budget"] == 0.05
    # rerunning with the same budget trains no further and gives the same model, even on a
    # machine ten times faster (catches a resume that depends on the machine's pace)
    fixed_pace(0.02)
    qm9.run(exp, runs, progress=False)
    _, again = qm9.load_run(runs)
    for name in ("shape", "decoder"):
        a, b = getattr(models, name).state_dict(), getattr(again, name).state_dict()
        assert all(torch.equal(a[key], b[key]) for key in a)
    # a larger budget continues all three models
    before = {sub: qm9.training_status(runs / sub)["iterations"] for sub in subs}
    qm9.run(qm9.QM9Experiment(**{**exp.__dict__, "flow_minutes": 0.1, "scale_minutes": 0.1}),
            runs, progress=False)  # fmt: skip
    assert all(qm9.training_status(runs / sub)["iterations"] > n for sub, n in before.items())
    # ... and another preset in the same directory is refused, naming the field
    with pytest.raises(qm9.RunMismatch, match="hidden"):
        qm9.run(qm9.QM9Experiment(**{**exp.__dict__, "hidden": (8,)}), runs, progress=False)
    with pytest.raises(qm9.RunMismatch, match="potential"):
        qm9.run(qm9.QM9Experiment(**{**exp.__dict__, "potential": "graph"}), runs,
                progress=False)  # fmt: skip


def test_old_run_directory(tmp_path, cache_dir):
    # a run directory from before the exact model was a TwoPartShapeFlow: its preset still loads
    # (new fields take their defaults), but it is refused as another run, naming the field
    old = tmp_path / "old"
    old.mkdir()
    preset = dataclasses.asdict(qm9.QM9Experiment(cache_dir=cache_dir))
    for key in ("potential", "graph_hidden", "layers", "chunk_size"):
        del preset[key]
    (old / "experiment.json").write_text(json.dumps(preset))
    assert read_preset(old, lambda d: qm9.QM9Experiment(**d), "QM9").potential == "mlp"
    with pytest.raises(qm9.RunMismatch, match="potential: '<missing>' -> 'mlp'"):
        qm9.run(qm9.QM9Experiment(cache_dir=cache_dir), old, progress=False)


def test_graph_potential_end_to_end(tmp_path, cache_dir, fixed_pace):
    # the permutation-invariant potential trains, evaluates and samples on a tiny budget, and
    # its exact model is invariant to relabelling the atoms (the MLP's is not)
    fixed_pace(1.2)  # a 3 s budget: 2 steps of each model, 2.4 s
    exp = qm9.QM9Experiment(potential="graph", graph_hidden=8, layers=1, flow_minutes=0.05,
                            scale_minutes=0.05, n_val=3, n_test=5, elbo_samples=2,
                            iwae_samples=4, cache_dir=cache_dir, atol=1e-3, rtol=1e-3)  # fmt: skip
    runs = tmp_path / "runs"
    qm9.run(exp, runs, progress=False)
    r = qm9.evaluate(runs, n_samples=6)
    assert r["potential"] == "graph" and r["n_test"] == 5
    assert all(r[f"{sub}_iterations"] == 2 for sub in ("flow", "gram", "decoder"))
    parts = r["test_nll_grassmann"] + r["test_nll_gram"] + r["mean_log_jacobian"]
    assert math.isfinite(r["test_nll"]) and r["test_nll"] == pytest.approx(parts, rel=1e-9)
    assert math.isfinite(r["paper_neg_elbo"]) and 0 < r["jsd"] <= math.log(2)
    assert np.load(runs / "samples.npy").shape == (6, 19, 3)
    _, models = qm9.load_run(runs)
    assert isinstance(models.flow.field.potential, GraphPotential)
    test = seeded_rows(qm9.load_molecules(cache_dir)["test"], 5)
    log_p = exact_log_prob(models, test)
    assert -log_p.mean().item() == pytest.approx(r["test_nll"], rel=1e-6)
    perm = torch.randperm(19, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        relabelled = models.shape.log_prob(test[:, perm])
    # the ODE's tolerance bounds the difference (1e-3 here); a non-invariant model is off by nats
    assert torch.allclose(relabelled, log_p, atol=0.05)
