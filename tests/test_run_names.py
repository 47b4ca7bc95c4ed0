"""The names a user reads: ``grassflow eval`` (test split and ``--data``) names a shape run's
model as `model_name` does (InternalFlow, ShapeFlow Cartesian / Grassmann), not by the
preset's identifier ``equivariant-cnf``, which every shape run carries."""

import json

import pytest

from grassflow.cli import main
from grassflow.tasks import shape_runs as shapes

pytest.importorskip("rdkit")


def test_eval_names_internalflow_for_an_internal_run(tmp_path, monkeypatch, capsys):
    """Catches the eval lines taking the results' ``model`` field (``equivariant-cnf`` for an
    InternalFlow run, issue 46's report) instead of the run's model, and a label that names
    the wrong one: the bracket must be ``model_name`` of the saved preset, whose geometry is
    checked independently to be ``internal``."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "conformers", "CCO", "--n", "30", "--minimized", "--no-progress"]) == 0
    data = "data/CCO-minimized.npz"
    assert main(["train", "--data", data, "--iterations", "3", "--no-eval", "--no-progress",
                 "--run-dir", "run"]) == 0  # fmt: skip
    saved = json.loads((tmp_path / "run" / "experiment.json").read_text())
    assert saved["geometry"] == "internal" and saved["model"] == "equivariant-cnf"
    name = shapes.model_name(shapes.load_run("run")[0])
    assert name.startswith("InternalFlow")
    capsys.readouterr()
    for extra in ([], ["--data", data]):
        assert main(["eval", "run", "--n-samples", "4", *extra]) == 0
        out = capsys.readouterr().out
        assert f"[9 points in 3-D, {name}]" in out and "equivariant-cnf" not in out
