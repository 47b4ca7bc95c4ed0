"""Run identity: a run directory is reused or continued only for the same preset and data."""

import json
import logging

import numpy as np
import pytest
import torch

from grassflow.tasks.run_dir import RunMismatch, claim_run_dir, data_identity, training_status
from grassflow.training import checkpoint_path

PRESET = {"system": "dw4", "source": "generated",
          "train": {"lr": 1e-3, "iterations": 100, "total_budget_minutes": 1.0,
                    "budget_minutes": None, "device": "auto", "betas": (0.9, 0.999)}}  # fmt: skip


def claim(*args, **kwargs):
    """claim_run_dir for runs of a test kind."""
    return claim_run_dir(*args, **{"kind": "test", **kwargs})


def preset(**train):
    return {**PRESET, "train": {**PRESET["train"], **train}}


def identity(x, path="/data/a"):
    return {"source": "generated", "path": path, **data_identity(train=x)}


X = np.arange(12.0).reshape(4, 3)


def test_data_identity_is_a_content_hash():
    # catches: a hash of the object (or of the path) rather than of the values and layout
    same = data_identity(a=torch.tensor(X.copy()))["a"]
    assert same == data_identity(a=X)["a"]
    Y = X.copy()
    Y[2, 1] += 1e-12
    assert data_identity(a=Y)["a"] != same
    assert data_identity(a=X.reshape(3, 4))["a"] != same  # same bytes, other shape
    assert data_identity(a=X.astype(np.float32))["a"] != same


def test_same_run_is_claimed_again_and_the_budget_may_grow(tmp_path):
    run = tmp_path / "run"
    claim(run, preset(), identity(X))
    assert json.loads((run / "experiment.json").read_text())["train"]["betas"] == [0.9, 0.999]
    claim(run, preset(), identity(X))  # the same run
    # per-invocation budget, device and the data's location are not the run's identity
    claim(run, preset(budget_minutes=3.0, device="cpu"), identity(X, path="/elsewhere"))
    # a longer run continues this one, and the preset records the new length
    claim(run, preset(total_budget_minutes=2.0, iterations=200), identity(X))
    saved = json.loads((run / "experiment.json").read_text())["train"]
    assert (saved["total_budget_minutes"], saved["iterations"]) == (2.0, 200)
    # None (as many iterations as the budget allows) is the longest run of all, so it
    # continues the run, and a count after it would shorten the run (catches: None compared
    # as a mismatch, or any count accepted after it)
    claim(run, preset(total_budget_minutes=2.0, iterations=None), identity(X))
    with pytest.raises(RunMismatch, match="train.iterations: None -> 300"):
        claim(run, preset(total_budget_minutes=2.0, iterations=300), identity(X))


def test_mismatches_name_every_field(tmp_path):
    # catches: a run reused for another preset, other data, or a smaller budget
    run = tmp_path / "run"
    claim(run, preset(), identity(X))
    with pytest.raises(RunMismatch, match="total_budget_minutes: 1.0 -> 0.5"):
        claim(run, preset(total_budget_minutes=0.5), identity(X))
    with pytest.raises(RunMismatch) as info:
        claim(run, {**preset(lr=1e-4), "source": "klein"}, identity(X + 1))
    message = str(info.value)
    for field in ("train.lr: 0.001 -> 0.0001", "source: 'generated' -> 'klein'", "data.train"):
        assert field in message
    assert "--force" in message
    with pytest.raises(RunMismatch, match=r"extra: '<missing>' -> 1"):
        claim(run, {**preset(), "extra": 1}, identity(X))
    # nothing was overwritten by the refused claims
    assert json.loads((run / "data.json").read_text()) == identity(X)


def test_force_starts_afresh(tmp_path, caplog):
    # catches: --force keeping the old run's checkpoints (a mix of two runs)
    run = tmp_path / "run"
    claim(run, preset(), identity(X))
    (run / "last.pt").write_bytes(b"old")
    with caplog.at_level(logging.WARNING):
        claim(run, preset(lr=1e-4), identity(X), force=True)
    assert not (run / "last.pt").exists() and "deleting" in caplog.text
    assert json.loads((run / "experiment.json").read_text())["train"]["lr"] == 1e-4


def test_checkpoints_without_a_preset_are_refused(tmp_path):
    # catches: adopting a directory of unknown provenance
    (tmp_path / "last.pt").write_bytes(b"x")
    with pytest.raises(RunMismatch, match="no experiment.json"):
        claim(tmp_path, preset(), identity(X))


def test_best_falls_back_to_last_loudly(tmp_path, caplog):
    # catches: a silent fallback from best.pt to last.pt, and a missing file found late
    with pytest.raises(FileNotFoundError, match="has .* been trained"):
        checkpoint_path(tmp_path)
    (tmp_path / "last.pt").write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        assert checkpoint_path(tmp_path) == tmp_path / "last.pt"
    assert "no best.pt" in caplog.text
    assert training_status(tmp_path / "new") == {
        "iterations": 0, "trained_minutes": 0.0, "cpu_minutes": 0.0, "wall_minutes": 0.0,
        "val_cpu_minutes": 0.0, "val_wall_minutes": 0.0, "clock": None, "threads": None,
        "spent_total_budget": None}  # fmt: skip


def test_training_status_of_old_and_new_checkpoints(tmp_path):
    # catches: CPU and wall minutes swapped, seconds reported as minutes, and checkpoints
    # written before CPU budgets (wall seconds in "elapsed" alone) becoming unreadable
    (tmp_path / "old").mkdir()
    torch.save({"iteration": 5, "elapsed": 90.0}, tmp_path / "old" / "last.pt")
    old = training_status(tmp_path / "old")
    assert (old["trained_minutes"], old["cpu_minutes"], old["wall_minutes"]) == (1.5, 1.5, 1.5)
    assert old["clock"] == "wall" and old["val_cpu_minutes"] is None
    (tmp_path / "new").mkdir()
    torch.save({"iteration": 7, "elapsed": 120.0, "clock": "cpu", "cpu_s": 120.0,
                "wall_s": 240.0, "val_cpu_s": 30.0, "val_wall_s": 60.0, "threads": 1},
               tmp_path / "new" / "last.pt")  # fmt: skip
    new = training_status(tmp_path / "new")
    assert (new["cpu_minutes"], new["wall_minutes"], new["val_cpu_minutes"],
            new["val_wall_minutes"], new["threads"]) == (2.0, 4.0, 0.5, 1.0, 1)  # fmt: skip


def test_data_location_is_not_the_identity(tmp_path):
    # catches: a run refused because its data moved (data_dir/cache_dir compared as strings)
    run = tmp_path / "run"
    claim(run, {**preset(), "data_dir": "data"}, identity(X))
    claim(run, {**preset(), "data_dir": "/elsewhere/data"}, identity(X, "/elsewhere"))


def test_runs_from_before_run_identities_are_adopted(tmp_path, caplog):
    # catches: every run directory written before data.json existed becoming unusable
    run = tmp_path / "run"
    run.mkdir()
    old = preset()
    del old["train"]["total_budget_minutes"]
    (run / "experiment.json").write_text(json.dumps(old))
    (run / "last.pt").write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        claim(run, preset(total_budget_minutes=None), identity(X))
    assert "predates data.json" in caplog.text
    assert json.loads((run / "data.json").read_text()) == identity(X)
    # from then on the data are checked
    with pytest.raises(RunMismatch, match="data.train"):
        claim(run, preset(total_budget_minutes=None), identity(X + 1))


def test_fields_added_later_keep_old_runs_resumable(tmp_path):
    # catches: every vs-E-NF run made before the two-part model's `gram` option (or another added
    # field) refusing to continue, while a run that really differs in it is still refused
    from grassflow_paper.vs_enf import ADDED_FIELDS, ENFExperiment

    run = tmp_path / "run"
    new = ENFExperiment().to_dict()
    old = {k: v for k, v in new.items() if k not in ("gram", "gram_components")}
    run.mkdir()
    (run / "experiment.json").write_text(json.dumps(old))
    (run / "data.json").write_text(json.dumps(identity(X)))
    kw = {"kind": "vs-enf", "added": ADDED_FIELDS, "budget_keys": ("minutes",)}
    claim(run, new, identity(X), **kw)
    assert json.loads((run / "experiment.json").read_text())["kind"] == "vs-enf"  # now saved
    with pytest.raises(RunMismatch, match="gram"):
        claim(run, {**new, "gram": "distance"}, identity(X), **kw)
    with pytest.raises(RunMismatch, match="kind"):  # the same preset, claimed as another kind
        claim(run, new, identity(X), budget_keys=("minutes",))


def test_no_resume_refuses_before_writing(tmp_path):
    # catches: a refused invocation overwriting the run's preset on its way out
    run = tmp_path / "run"
    claim(run, preset(), identity(X))
    (run / "last.pt").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="last.pt"):
        claim(run, preset(iterations=2000), identity(X), resume=False)
    assert json.loads((run / "experiment.json").read_text())["train"]["iterations"] == 100
