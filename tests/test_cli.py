import json
import shutil

import numpy as np
import pytest
import torch

import grassflow.cli as cli
from grassflow.cli import main
from grassflow.manifolds import orthonormality_error
from grassflow.tasks.run_dir import training_status
from grassflow.training import distributed as dd
from grassflow_paper.fm_vs_mle import _summary, markdown_table

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_reproduce_fm_vs_mle_end_to_end(tmp_path, fixed_pace):
    fixed_pace(0.07)  # a 1.8 s budget: 25 steps, 1.75 s
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
    # the summary must describe these curves (its arithmetic is checked on known curves in
    # test_fm_vs_mle_summary_on_known_curves); catches a summary computed from other points
    mle_points = res["curves"]["mle"]
    target = min(p["test_nll"] for p in mle_points)
    t_mle = next(p["seconds"] for p in mle_points if p["test_nll"] == target)
    assert res["summary"]["mle"]["best_nll"] == target
    assert res["summary"]["mle"]["seconds_to_mle_best"] == t_mle
    ot = res["summary"]["fm-ot"]
    assert ot["best_nll"] == min(p["test_nll"] for p in res["curves"]["fm-ot"])
    reached = [p["seconds"] for p in res["curves"]["fm-ot"] if p["test_nll"] <= target]
    if reached:
        assert ot["seconds_to_mle_best"] == reached[0]
        assert ot["time_ratio_over_mle"] == pytest.approx(reached[0] / t_mle, rel=1e-12)
    else:
        assert ot["seconds_to_mle_best"] is None and ot["time_ratio_over_mle"] is None
    assert (out / "fm_vs_mle.png").stat().st_size > 10_000
    for objective in ("mle", "fm-ot"):
        assert res["summary"][objective]["iterations"] == 25
        assert training_status(runs / f"target-{objective}")["spent_total_budget"] == 0.03
    # catches: a rerun with the same budget training again or re-evaluating the snapshots
    stamps = {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()}
    assert main(args) == 0
    assert json.loads((out / "fm_vs_mle.json").read_text()) == result
    changed = [p.name for p in runs.rglob("*") if p.is_file() and p.stat().st_mtime_ns
               != stamps.get(p)]  # fmt: skip
    assert set(changed) <= {"config.json", "experiment.json", "data.json"}, changed
    # catches: a larger budget restarting (or not continuing) the runs, and snapshots of a
    # crashed invocation (past last.pt, whose steps are redone) surviving into the curve
    snap_dir = runs / "target-mle" / "snapshots"
    snaps = sorted(p.name for p in snap_dir.glob("*.pt"))
    stale = snap_dir / f"{10**8:09d}.pt"
    shutil.copy(snap_dir / snaps[-1], stale)
    iterations = res["summary"]["mle"]["iterations"]
    assert main([*args[:-4], "--budget-minutes-per-dataset", "0.06", "--no-progress",
                 "--objectives", "fm-ot", "mle"]) == 0  # fmt: skip
    more = json.loads((out / "fm_vs_mle.json").read_text())["datasets"]["target"]
    assert more["summary"]["mle"]["iterations"] > iterations
    assert more["curves"]["mle"][: len(snaps)] == res["curves"]["mle"]  # kept, not redone
    assert len(more["curves"]["mle"]) > len(snaps) and not stale.exists()
    assert all(p["iteration"] <= more["summary"]["mle"]["iterations"]
               for p in more["curves"]["mle"])  # fmt: skip


def _curve(*points):
    return [{"seconds": s, "iteration": i, "test_nll": v, "test_nll_sem": 0.01}
            for s, i, v in points]  # fmt: skip


def test_fm_vs_mle_summary_on_known_curves():
    # catches: best NLL taken from the last point, time to the target measured to the wrong
    # point (last, best of the objective itself, first below a strict <), ratio inverted,
    # or an objective that never reaches the target given a number instead of None
    curves = {
        # MLE's best (1.2) is neither its first nor its last point; it is reached at 40 s
        "mle": _curve((10, 100, 2.0), (20, 200, 1.5), (40, 400, 1.2), (80, 800, 1.3)),
        # reaches exactly 1.2 at 10 s (<= counts), and goes on to a better 1.0 at 30 s
        "fm": _curve((1, 1000, 1.9), (5, 5000, 1.25), (10, 10_000, 1.2), (30, 30_000, 1.0)),
        # never gets to 1.2
        "fm-ot": _curve((2, 100, 1.8), (4, 200, 1.5), (8, 400, 1.21)),
    }
    s = _summary(curves)
    assert (s["mle"]["best_nll"], s["fm"]["best_nll"], s["fm-ot"]["best_nll"]) == (1.2, 1.0, 1.21)
    assert s["mle"]["seconds_to_mle_best"] == 40
    assert s["mle"]["time_ratio_over_mle"] == 1.0
    assert s["fm"]["seconds_to_mle_best"] == 10
    assert s["fm"]["time_ratio_over_mle"] == pytest.approx(0.25)  # FM 4x faster than MLE
    assert s["fm-ot"]["seconds_to_mle_best"] is None
    assert s["fm-ot"]["time_ratio_over_mle"] is None
    # slower than MLE: ratio above one
    slow = _summary({"mle": curves["mle"], "fm": _curve((50, 10, 1.3), (100, 20, 1.1))})
    assert slow["fm"]["seconds_to_mle_best"] == 100
    assert slow["fm"]["time_ratio_over_mle"] == pytest.approx(2.5)
    # the table says "not reached" for fm-ot and gives FM's ratio
    for summary in s.values():  # the run's own numbers, which compare() adds
        summary.setdefault("iterations", 1)
        summary.setdefault("trained_minutes", 1.0)
    table = markdown_table({"budget_minutes": 1, "objectives": list(curves),
                            "datasets": {"2sines": {"curves": curves, "summary": s}}})
    rows = {line.split("|")[2].strip(): line for line in table.splitlines()
            if line.startswith("| 2sines")}  # fmt: skip
    assert "not reached" in rows["FM-OT"] and "(0.25)" in rows["FM"]
    assert "not reached" not in rows["MLE"] and "not reached" not in rows["FM"]


def test_cli_errors(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "experiment.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "nope", "--run-dir", str(tmp_path)])


@pytest.fixture
def shutdowns(monkeypatch):
    """Count calls of the distributed shutdown that `main` must always make."""
    calls = []
    monkeypatch.setattr(dd, "shutdown", lambda: calls.append(1))
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    return calls


def test_user_error_is_one_line_with_a_hint(tmp_path, capsys, shutdowns):
    # catches: a traceback dumped on users for a missing file, a zero exit code, or the
    # process group left open (a torchrun job that hangs) after an error
    assert main(["eval", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("grassflow eval: error: ") and "experiment.json" in err
    assert "(rerun with --debug for the traceback)" in err
    assert shutdowns == [1]


@pytest.mark.parametrize("how", ["--debug first", "--debug last", "env"])
def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch, shutdowns, how):
    # catches: --debug (before or after the subcommand) or GRASSFLOW_DEBUG=1 ignored
    argv = ["eval", str(tmp_path / "missing")]
    if how == "--debug first":
        argv = ["--debug", *argv]
    elif how == "--debug last":
        argv = [*argv, "--debug"]
    else:
        monkeypatch.setenv(cli.DEBUG_ENV, "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "FileNotFoundError" in err
    assert "_run_kind" in err  # the frame that raised
    assert err.rstrip().splitlines()[-1].startswith("grassflow eval: error: ")
    assert "rerun with --debug" not in err
    assert shutdowns == [1]


def test_debug_env_zero_is_off(tmp_path, capsys, monkeypatch, shutdowns):
    # catches: GRASSFLOW_DEBUG=0 read as "set"
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_internal_errors_keep_their_traceback_and_shut_down(monkeypatch, shutdowns):
    # catches: a bug (not a user error) swallowed into exit code 2, or the shutdown
    # skipped when an unexpected exception propagates
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli.run_commands, "cmd_eval", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["eval", "anywhere"])
    assert shutdowns == [1]


def test_success_and_divergence_shut_down(monkeypatch, capsys, shutdowns):
    # catches: the shutdown run only on some exit paths; a diverged run not exit code 3
    from grassflow.training import TrainingDiverged

    monkeypatch.setattr(cli.run_commands, "cmd_eval", lambda args: print("fine"))
    assert main(["eval", "anywhere"]) == 0
    assert shutdowns == [1]

    def diverge(args):
        raise TrainingDiverged("loss is nan at iteration 7", result=None)

    monkeypatch.setattr(cli.run_commands, "cmd_eval", diverge)
    assert main(["eval", "anywhere"]) == 3
    err = capsys.readouterr().err
    assert "training diverged: loss is nan at iteration 7" in err and "Traceback" not in err
    assert shutdowns == [1, 1]


def test_reproduce_table2_options_reach_the_preset(tmp_path, monkeypatch, capsys):
    # catches: --potential (or a budget) parsed but not passed on to the QM9 preset
    from grassflow_paper import qm9_report

    seen = {}

    def reproduce(out, runs, exp, progress, force, summary_dir):
        seen.update(exp=exp, out=out, runs=runs, force=force, summary=summary_dir)
        return {}

    monkeypatch.setattr(qm9_report, "reproduce", reproduce)
    monkeypatch.setattr(qm9_report, "markdown_table", lambda r: "table")
    args = ["reproduce", "table2", "--potential", "graph", "--budget", "2", "--scale-budget",
            "0.5", "--runs", str(tmp_path / "r"), "--force"]  # fmt: skip
    assert main(args) == 0
    exp = seen["exp"]
    assert (exp.potential, exp.flow_minutes, exp.scale_minutes) == ("graph", 2.0, 0.5)
    assert exp.hidden == (32, 32, 32) and seen["force"] and seen["runs"] == str(tmp_path / "r")
    assert seen["summary"] == "results"  # the issue-14 summary is kept up to date
    assert main(["reproduce", "table2", "--runs", str(tmp_path / "r"), "--summary", ""]) == 0
    assert seen["exp"].potential == "mlp"  # the paper's potential by default
    assert seen["summary"] is None
    with pytest.raises(SystemExit):
        main(["reproduce", "table2", "--potential", "transformer"])
    # catches: the EGNN field's options dropped, and a row's command that rebuilds another run
    from grassflow_paper.vs_enf import table2_command

    args = ["reproduce", "table2", "--potential", "egnn", "--gram", "distance",
            "--gram-components", "2", "--n-val", "50", "--val-every-minutes", "3", "--n-test",
            "300", "--budget", "17", "--scale-budget", "3", "--tol", "1e-4"]  # fmt: skip
    assert main(args) == 0
    exp = seen["exp"]
    assert (exp.gram, exp.gram_components, exp.layers, exp.n_val, exp.val_every_minutes,
            exp.n_test, exp.atol, exp.rtol) == ("distance", 2, 3, 50, 3.0, 300, 1e-4, 1e-4)
    assert main(table2_command(exp).split()[1:]) == 0 and seen["exp"] == exp


def test_threads_option(monkeypatch, capsys):
    # catches: --threads not reaching torch, auto not meaning one thread (or the environment's
    # count), a bad value accepted silently, and a call of main() leaving its threads behind
    import torch

    from grassflow.training.threads import THREADS_ENV, resolve_threads

    seen = []
    monkeypatch.setattr("grassflow.cli.data_commands.cmd_data_compare",
                        lambda args: seen.append(torch.get_num_threads()))  # fmt: skip
    before = torch.get_num_threads()
    assert main(["--threads", "3", "data", "compare"]) == 0
    assert main(["data", "compare", "--threads", "2"]) == 0
    assert main(["data", "compare"]) == 0
    monkeypatch.setenv(THREADS_ENV, "2")
    assert main(["data", "compare"]) == 0
    assert seen == [3, 2, 1, 2] and torch.get_num_threads() == before
    assert main(["data", "compare", "--threads", "many"]) == 2
    assert "threads must be 'auto' or a positive integer" in capsys.readouterr().err
    monkeypatch.setenv(THREADS_ENV, "0")
    with pytest.raises(ValueError, match=THREADS_ENV):
        resolve_threads("auto")


def test_version_is_the_installed_packages(capsys):
    """`grassflow --version` prints the package's one version, the one pip installed (a second
    hard-coded version, or a stale one in the CLI, would differ)."""
    from importlib.metadata import version

    import grassflow

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"grassflow {grassflow.__version__}"
    assert version("grassflow") == grassflow.__version__


def test_one_budget_vocabulary_and_the_old_spellings():
    """`--minutes` is a run's total everywhere and `--session-minutes` one invocation's.
    Catches: a command recorded in results/ (old spellings) that no longer parses the same, or
    `--minutes` reaching the per-invocation budget (a rerun would then train again)."""
    from grassflow.cli.options import apply_overrides
    from grassflow.cli.run_commands import _shape_experiment
    from grassflow.tasks import texture_runs as tx

    parser = cli.build_parser()
    for old, new in [
        ("reproduce table2 --budget 3 --scale-budget 2", "reproduce table2 --minutes 3 "
         "--scale-minutes 2"),
        ("reproduce textures --budget-minutes-per-dataset 4", "reproduce textures --minutes 4"),
        ("reproduce fm-vs-mle --budget-minutes-per-dataset 4", "reproduce fm-vs-mle --minutes 4"),
        ("reproduce table1 --budget 2", "reproduce table1 --minutes 2"),
        ("train --run-dir r --budget-minutes 1", "train --run-dir r --session-minutes 1"),
    ]:  # fmt: skip
        assert vars(parser.parse_args(old.split())) == vars(parser.parse_args(new.split()))
    exp = apply_overrides(tx.DEMO, parser.parse_args(
        "train --run-dir r --minutes 10 --session-minutes 1".split()))  # fmt: skip
    assert (exp.train.total_budget_minutes, exp.train.budget_minutes) == (10.0, 1.0)
    # reproduce textures: its --minutes is each dataset's run, set by reproduce itself
    exp = apply_overrides(tx.DEMO, parser.parse_args("reproduce textures --minutes 4".split()))
    assert exp.train.total_budget_minutes == tx.DEMO.train.total_budget_minutes
    exp = _shape_experiment(parser.parse_args(
        "train --run-dir r --data c.npy --minutes 10 --session-minutes 5".split()))  # fmt: skip
    assert (exp.flow.total_budget_minutes, exp.flow.budget_minutes) == (10.0, 5.0)
