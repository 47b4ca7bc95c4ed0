"""QM9 experiment end to end on a tiny budget (needs qm9pack, in the test extra)."""

import json
import math

import numpy as np
import pytest
import torch

from grassflow.data import qm9 as qm9data
from grassflow.experiments import qm9, qm9_report

try:
    qm9data.qm9pack_data_dir()
except ImportError:
    pytest.skip("qm9pack is not installed (pip install -e '.[qm9]')", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_reproduce_table2_tiny(tmp_path):
    exp = qm9.QM9Experiment(flow_minutes=0.02, scale_minutes=0.02, n_val=16, n_test=24,
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
    assert 0 <= r["jsd_test_data"] < 0.05 and 0 < r["jsd"] <= math.log(2)  # 24 molecules
    assert json.loads((out / "table2.json").read_text()) == r
    assert "-70.2" in (out / "table2.md").read_text()
    assert (out / "distances.png").stat().st_size > 10_000
    assert (out / "figure5.png").stat().st_size > 10_000 and len(r["figure5_rmsd"]) == 4
    xyz = (out / "samples.xyz").read_text().splitlines()
    assert xyz[0] == "19" and len(xyz) == 10 * 21 and xyz[2].startswith("X ")
    # generated molecules are centred 19-atom configurations
    X = np.load(runs / "samples.npy")
    assert X.shape == (40, 19, 3) and np.abs(X.mean(axis=1)).max() < 1e-4
    # rerunning with the same budget trains no further and gives the same model
    _, models = qm9.load_run(runs)
    qm9.run(exp, runs, progress=False)
    _, again = qm9.load_run(runs)
    for name in ("flow", "scale", "decoder"):
        a, b = getattr(models, name).state_dict(), getattr(again, name).state_dict()
        assert all(torch.equal(a[key], b[key]) for key in a)
