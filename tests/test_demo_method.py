"""`grassflow demo` says which method and objective it trained with, and resumes."""

import json

import pytest
import torch

from grassflow.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAST = ["--no-progress", "--atol", "1e-3", "--rtol", "1e-3", "--budget-minutes", "10"]


def _demo(out, *extra):
    return main(["demo", "--out", str(out), "--iterations", "20", "--batch-size", "50",
                 *extra, *FAST])  # fmt: skip


@pytest.mark.parametrize(("preset", "objective", "words"), [
    ("fourier", "fm", "Fourier HorP"), ("paper", "mle", "tanh HorP"),
])  # fmt: skip
def test_demo_prints_its_method(tmp_path, capsys, preset, objective, words):
    # catches: the demo training one objective while saying another, or saying nothing
    assert _demo(tmp_path / "run", "--preset", preset) == 0
    out = capsys.readouterr().out
    assert f"objective {objective}" in out and words in out
    trained = json.loads((tmp_path / "run" / "experiment.json").read_text())
    assert trained["objective"] == objective
    assert (trained["fourier_scale"] is None) == (preset == "paper")


def test_demo_default_is_flow_matching_and_resumes(tmp_path, capsys):
    # catches: a default that is not the documented one, or a rerun that restarts
    run = tmp_path / "run"
    assert _demo(run) == 0
    assert "objective fm" in capsys.readouterr().out
    assert main(["demo", "--out", str(run), "--iterations", "30", "--batch-size", "50",
                 *FAST]) == 0  # fmt: skip
    assert "resuming the demo run" in capsys.readouterr().out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["iteration"] == 30


def test_demo_does_not_depend_on_the_machines_pace(tmp_path, fixed_pace):
    # catches: a time budget in the demo preset (a busy or slow machine then trains fewer
    # iterations and draws another picture): the same command on a fast and on a 100x slower
    # machine must train the same iterations to the same weights
    from grassflow.tasks import texture_runs as tx
    from grassflow.training import load_checkpoint

    assert tx.DEMO.train.budget_minutes is None and tx.DEMO_PAPER.train.budget_minutes is None
    weights = []
    for name, step in (("fast", 0.001), ("slow", 10.0)):  # 25 slow steps: 250 s > 3 min
        fixed_pace(step)
        assert main(["demo", "--out", str(tmp_path / name), "--iterations", "25",
                     "--batch-size", "50", *FAST[:5]]) == 0  # fmt: skip
        weights.append(load_checkpoint(tmp_path / name / "last.pt")["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
