import json

import numpy as np
import pytest
import torch

from grassflow.cli import main
from grassflow.manifolds import orthonormality_error

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_train_resume_eval_sample_plot(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--dataset", "2sines", "--run-dir", str(run), "--batch-size", "16",
            "--no-progress", "--atol", "1e-3", "--rtol", "1e-3"]
    assert main([*args, "--iterations", "2"]) == 0
    # a second plain `train` must not silently overwrite the run
    assert main([*args, "--iterations", "2"]) == 2
    assert "resume" in capsys.readouterr().err
    assert main([*args, "--iterations", "4", "--resume"]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["iteration"] == 4

    assert main(["eval", str(run), "--n-samples", "50"]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["uniform_nll"] == pytest.approx(np.log(2 * np.pi))
    assert np.isfinite(result["test_nll"]) and result["antipodal_max_dist"] < 1e-3

    out = tmp_path / "s.npz"
    assert main(["sample", str(run), "--n", "7", "--out", str(out)]) == 0
    saved = np.load(out)
    assert saved["Y"].shape == (7, 3, 1) and np.isfinite(saved["log_prob"]).all()
    assert orthonormality_error(torch.from_numpy(saved["Y"])).max() < 1e-5

    prior_png = tmp_path / "prior.png"
    assert main(["plot", "--prior", str(prior_png)]) == 0
    assert prior_png.stat().st_size > 10_000


def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "--budget-minutes", "0.02", "--no-progress",
               "--atol", "1e-3", "--rtol", "1e-3"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "test NLL" in text and "uniform 1.838" in text
    for name in ("textures.png", "antipodal.png", "prior.png", "eval.json", "last.pt"):
        assert (out / name).stat().st_size > 0


def test_train_with_flow_matching(tmp_path):
    run = tmp_path / "fm"
    rc = main(["train", "--dataset", "target", "--run-dir", str(run), "--objective", "fm",
               "--iterations", "5", "--batch-size", "32", "--no-progress",
               "--atol", "1e-3", "--rtol", "1e-3"])
    assert rc == 0
    assert json.loads((run / "experiment.json").read_text())["objective"] == "fm"
    # the checkpoint is an ordinary GrCNF: eval works unchanged
    assert main(["eval", str(run), "--n-samples", "20"]) == 0
    assert np.isfinite(json.loads((run / "eval.json").read_text())["test_nll"])


def test_reproduce_fm_vs_mle_end_to_end(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["reproduce", "fm-vs-mle", "--datasets", "target", "--out", str(out), "--runs",
            str(runs), "--budget-minutes-per-dataset", "0.03", "--no-progress",
            "--objectives", "fm-ot", "mle"]
    assert main(args) == 0
    result = json.loads((out / "fm_vs_mle.json").read_text())
    assert result["objectives"] == ["mle", "fm-ot"]  # MLE first: it is the reference
    res = result["datasets"]["target"]
    for objective in ("mle", "fm-ot"):
        points = res["curves"][objective]
        assert points and all(np.isfinite(p["test_nll"]) for p in points)
        seconds = [p["seconds"] for p in points]
        assert seconds == sorted(seconds)
    mle = res["summary"]["mle"]
    assert mle["best_nll"] == min(p["test_nll"] for p in res["curves"]["mle"])
    assert mle["time_ratio_over_mle"] == 1.0
    assert (out / "fm_vs_mle.png").stat().st_size > 10_000
    # a rerun reuses the finished curves instead of training again
    (runs / "target-mle" / "last.pt").unlink()
    assert main(args) == 0
    assert json.loads((out / "fm_vs_mle.json").read_text()) == result
    assert not (runs / "target-mle" / "last.pt").exists()


def test_cli_errors(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "experiment.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "nope", "--run-dir", str(tmp_path)])
