"""`grassflow demo` says which method and objective it trained with, and resumes."""

import json

import pytest

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
