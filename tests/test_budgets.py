"""Budgets that cover a whole command: how a ShapeFlow's budget is shared between its parts,
on synthetic clouds and a clock the test controls (no data files, no sleeping)."""

import numpy as np
import pytest

from grassflow.cli import main
from grassflow.experiments import shapes, vs_enf
from grassflow.experiments.runs import training_status

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_split_budget_shares():
    # catches: a Gram share that is not capped, or shares that do not add up to the budget
    assert shapes.split_budget(4.0) == pytest.approx((3.6, 0.4))
    assert shapes.split_budget(20.0) == pytest.approx((19.0, 1.0))  # capped at 1 min
    assert shapes.split_budget(7.0, 0.3, 3.0) == pytest.approx((4.9, 2.1))
    assert vs_enf.ENFExperiment(minutes=20.0).budgets() == pytest.approx((19.0, 1.0))
    for bad in ((0.0,), (1.0, 1.0), (1.0, 0.1, 0.0)):
        with pytest.raises(ValueError, match="gram_fraction"):
            shapes.split_budget(*bad)


def test_train_data_budget_covers_both_parts(tmp_path, fixed_pace):
    # catches: `train --data --budget-minutes B` giving the budget to the flow alone while
    # the Gram density trains its own iteration count on top (seen: 4 min asked, 10.5 ran)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "clouds.npy", rng.standard_normal((40, 4, 2)))
    fixed_pace(0.7)  # every step of either part: 0.7 CPU s
    run = tmp_path / "run"
    argv = ["train", "--data", str(tmp_path / "clouds.npy"), "--run-dir", str(run),
            "--budget-minutes", "0.5", "--no-progress", "--atol", "1e-3", "--rtol", "1e-3"]
    assert main(argv) == 0
    flow, gram = training_status(run / "flow"), training_status(run / "gram")
    # flow: 27 s of 0.7 s steps -> 38 steps (26.6 s); Gram: 3 s -> 4 steps (2.8 s)
    assert (flow["iterations"], gram["iterations"]) == (38, 4)
    assert flow["cpu_minutes"] + gram["cpu_minutes"] <= 0.5
    assert flow["clock"] == gram["clock"] == "cpu"
