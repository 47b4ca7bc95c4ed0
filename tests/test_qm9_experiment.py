"""QM9 experiment end to end on a tiny budget (needs qm9pack, in the test extra)."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon, pdist

from grassflow.data import qm9 as qm9data
from grassflow.data.shapes import helmert_basis
from grassflow.experiments import qm9, qm9_report

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


def test_reproduce_table2_tiny(tmp_path, fixed_pace):
    fixed_pace(0.35)  # a 3 s budget: 8 steps, 2.8 s
    exp = qm9.QM9Experiment(flow_minutes=0.05, scale_minutes=0.05, n_val=16, n_test=24,
                            cache_dir=str(tmp_path / "cache"), atol=1e-4, rtol=1e-4)  # fmt: skip
    out, runs = tmp_path / "out", tmp_path / "runs"
    r = qm9_report.reproduce(out, runs, exp, progress=False, n_samples=40)
    assert r["n_test"] == 24 and math.isfinite(r["test_nll"])
    # the exact NLL is the sum of its parts
    parts = r["test_nll_grassmann"] + r["test_nll_eigenvalues"] + r["mean_log_jacobian"]
    assert r["test_nll"] == pytest.approx(parts, rel=1e-9)
    # the paper's model: NLL <= IWAE bound <= -ELBO (up to the Monte Carlo noise)
    assert math.isfinite(r["paper_neg_elbo"]) and r["paper_nll_iwae"] <= r["paper_neg_elbo"]
    assert 0 < r["paper_jsd"] <= math.log(2)
    assert np.load(runs / "samples_paper.npy").shape == (40, 19, 3)
    # catches: a JSD on the wrong histograms, bins or pairs (compared with scipy's, by hand)
    train = (helmert_basis(19) @ qm9.load_split(exp.cache_dir)["train"]).numpy()
    assert r["jsd"] == pytest.approx(jsd_by_hand(np.load(runs / "samples.npy"), train), rel=1e-6)
    assert r["paper_jsd"] == pytest.approx(
        jsd_by_hand(np.load(runs / "samples_paper.npy"), train), rel=1e-6)
    assert 0 <= r["jsd_test_data"] < 0.05 < r["jsd"]  # 24 test molecules vs untrained samples
    assert json.loads((out / "table2.json").read_text()) == r
    assert "-70.2" in (out / "table2.md").read_text()
    assert (out / "distances.png").stat().st_size > 10_000
    assert (out / "figure5.png").stat().st_size > 10_000 and len(r["figure5_rmsd"]) == 4
    xyz = (out / "samples.xyz").read_text().splitlines()
    assert xyz[0] == "19" and len(xyz) == 10 * 21 and xyz[2].startswith("X ")
    # generated molecules are centred 19-atom configurations
    X = np.load(runs / "samples.npy")
    assert X.shape == (40, 19, 3) and np.abs(X.mean(axis=1)).max() < 1e-4
    for sub in ("flow", "scale", "decoder"):
        assert r[f"{sub}_iterations"] == 8 and r[f"{sub}_minutes"] == pytest.approx(2.8 / 60)
        assert qm9.training_status(runs / sub)["spent_total_budget"] == 0.05
    # rerunning with the same budget trains no further and gives the same model, even on a
    # machine ten times faster (catches a resume that depends on the machine's pace)
    _, models = qm9.load_run(runs)
    fixed_pace(0.02)
    qm9.run(exp, runs, progress=False)
    _, again = qm9.load_run(runs)
    for name in ("flow", "scale", "decoder"):
        a, b = getattr(models, name).state_dict(), getattr(again, name).state_dict()
        assert all(torch.equal(a[key], b[key]) for key in a)
    # a larger budget continues all three models
    before = {sub: qm9.training_status(runs / sub)["iterations"]
              for sub in ("flow", "scale", "decoder")}  # fmt: skip
    qm9.run(qm9.QM9Experiment(**{**exp.__dict__, "flow_minutes": 0.1, "scale_minutes": 0.1}),
            runs, progress=False)  # fmt: skip
    assert all(qm9.training_status(runs / sub)["iterations"] > n for sub, n in before.items())
    # ... and another preset in the same directory is refused, naming the field
    with pytest.raises(qm9.RunMismatch, match="hidden"):
        qm9.run(qm9.QM9Experiment(**{**exp.__dict__, "hidden": (8,)}), runs, progress=False)
