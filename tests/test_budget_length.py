"""A budgeted InternalFlow run is ended by its budget, not by the preset's 20,000 steps
(issue 46: ``train --torsions circle --minutes 20`` stopped after 6 CPU minutes, still
improving); a user's ``--iterations`` stands."""

import json

import pytest

from grassflow.cli import main
from grassflow.training.metrics_log import read_metrics

pytest.importorskip("rdkit")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    out = root / "CCO.npz"
    assert main(["data", "conformers", "CCO", "--n", "30", "--minimized", "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    return out


def _flow(run) -> dict:
    return json.loads((run / "experiment.json").read_text())["flow"]


def test_a_budget_lifts_the_step_cap(data, tmp_path):
    """Catches the preset's ``iterations=20_000`` left on a run given ``--minutes``: the saved
    preset must have no step count, and the budget must be what the run records."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--minutes", "0.02", "--no-eval",
                 "--no-progress", "--run-dir", str(run)]) == 0  # fmt: skip
    flow = _flow(run)
    assert flow["iterations"] is None and flow["total_budget_minutes"] == 0.02


def test_a_users_iterations_stand_with_a_budget(data, tmp_path):
    """Catches the budget rule overriding ``--iterations``: 7 steps asked, 7 trained, with a
    budget far longer than they take."""
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--minutes", "5", "--iterations", "7",
                 "--no-eval", "--no-progress", "--run-dir", str(run)]) == 0  # fmt: skip
    assert _flow(run)["iterations"] == 7
    last = read_metrics(run / "flow" / "metrics.jsonl")
    assert max(r["iteration"] for r in last) == 7
