"""Budgets that cover a whole command (`train --data`: training, validation and the final
evaluation), and how the paper's two-part model shares its budget between its parts, on
synthetic clouds and a clock the test controls (no data files, no sleeping)."""

import numpy as np
import pytest
import torch
from torch import nn

from grassflow.cli import main
from grassflow.tasks.run_dir import training_status
from grassflow.training import TrainConfig, train
from grassflow_paper import two_part, vs_enf

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_split_budget_shares():
    # catches: a Gram share that is not capped, or shares that do not add up to the budget
    assert two_part.split_budget(4.0) == pytest.approx((2.8, 1.2))
    assert two_part.split_budget(20.0) == pytest.approx((17.0, 3.0))  # capped at 3 min
    assert two_part.split_budget(7.0, 0.1, 1.0) == pytest.approx((6.3, 0.7))
    assert vs_enf.ENFExperiment(minutes=20.0).budgets() == pytest.approx((19.0, 1.0))
    for bad in ((0.0,), (1.0, 1.0), (1.0, 0.1, 0.0)):
        with pytest.raises(ValueError, match="gram_fraction"):
            two_part.split_budget(*bad)


def test_train_data_budget_bounds_the_training(tmp_path, fixed_pace):
    # catches: `train --data --budget-minutes B` training past its budget, or on another
    # clock than the CPU's
    rng = np.random.default_rng(0)
    np.save(tmp_path / "clouds.npy", rng.standard_normal((40, 4, 2)))
    fixed_pace(0.8)  # every step: 0.8 CPU s
    run = tmp_path / "run"
    argv = ["train", "--data", str(tmp_path / "clouds.npy"), "--run-dir", str(run),
            "--budget-minutes", "0.5", "--no-progress", "--atol", "1e-3",
            "--rtol", "1e-3"]  # fmt: skip
    assert main(argv) == 0
    flow = training_status(run / "flow")
    assert flow["iterations"] == 37  # 30 s of 0.8 s steps -> 37 steps (29.6 s)
    assert flow["cpu_minutes"] <= 0.5 and flow["clock"] == "cpu"
    assert not (run / "gram").exists()


class _Gaussian(nn.Module):
    """A unit Gaussian with a learned mean: the smallest model `train` accepts."""

    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(3, 1, dtype=torch.float64))

    def log_prob(self, Y):
        return -0.5 * (Y - self.mu).square().sum((-2, -1))


def test_total_budget_left_after_a_resume_is_counted_in_cpu_time(tmp_path, fixed_pace):
    # catches: the remaining total budget measured on the wall clock instead of the CPU clock
    # (two threads: a CPU second passes every half wall second, so wall time left would be
    # twice too much). A first call trains 10 steps of 1 wall s = 2 CPU s (20 of the 30 CPU s
    # of total_budget_minutes=0.5); the resumed call has 10 CPU s left: 5 steps, and the run
    # stays within its total (20 steps and 40 CPU s if wall seconds were subtracted).
    from grassflow.training import objectives

    fixed_pace(1.0, threads=2.0)
    data = torch.randn(64, 3, 1, dtype=torch.float64)
    run = tmp_path / "run"
    cfg = TrainConfig(lr=0.01, batch_size=8, iterations=10, log_every=5, val_every=None,
                      checkpoint_every=5, device="cpu", dtype="float64",
                      total_budget_minutes=0.5)  # fmt: skip
    go = lambda cfg, resume: train(_Gaussian(), data, cfg, run, resume=resume, progress=False,
                                   objective=objectives.OBJECTIVES["mle"])  # fmt: skip
    first = go(cfg, False)
    assert first.stopped == "done" and first.iterations == 10
    assert first.cpu_seconds == pytest.approx(20.0) and first.wall_seconds == pytest.approx(10.0)
    second = go(cfg.replace(iterations=1000), True)
    assert second.stopped == "budget" and second.iterations == 15, second.message
    assert second.cpu_seconds == pytest.approx(30.0)  # the whole run: 60 * 0.5 CPU s


def test_the_work_before_training_is_charged_and_kept_across_resumes(tmp_path, fixed_pace):
    # catches: a command's start-up (imports, loading the data) left out of its --minutes,
    # or charged again (or forgotten) when the run resumes
    from grassflow.training import objectives
    from grassflow.training.clock import Stopwatch

    fixed_pace(0.8)
    data = torch.randn(64, 3, 1, dtype=torch.float64)
    run = tmp_path / "run"
    cfg = TrainConfig(lr=0.01, batch_size=8, iterations=None, log_every=5, val_every=None,
                      checkpoint_every=5, device="cpu", dtype="float64",
                      total_budget_minutes=0.5, charge_validation=True)  # fmt: skip
    go = lambda cfg, setup_s: train(_Gaussian(), data, cfg, run, resume=True, progress=False,
                                    objective=objectives.OBJECTIVES["mle"],
                                    setup=Stopwatch(cpu=setup_s).start())  # fmt: skip
    first = go(cfg, 12.0)  # 30 s less 12 s of start-up: 22 steps of 0.8 s
    assert first.stopped == "budget" and first.iterations == 22, first.message
    second = go(cfg.replace(total_budget_minutes=1.0), 6.0)  # 60 - 18 - 17.6: 30 steps more
    assert second.iterations == 52, second.message
    assert training_status(run)["cpu_minutes"] == pytest.approx(52 * 0.8 / 60)
    free = go(cfg.replace(total_budget_minutes=1.5, charge_validation=False), 30.0)
    assert free.iterations == 112, free.message  # not charged: 90 s of training, 60 steps more


def test_train_dataset_charges_its_start_up_to_minutes(tmp_path, fixed_pace, monkeypatch,
                                                     capsys):  # fmt: skip
    # catches: `train --dataset` (textures, DW4, LJ13) leaving the command's start-up
    # (imports, building the data and the model) out of --minutes, as `train --data` does not
    import re

    from grassflow.tasks import texture_runs
    from grassflow.training import clock

    build = texture_runs.build_model

    def steps(name: str, start_up_s: float) -> int:
        fixed_pace(0.8)  # a fresh process: its clocks start at 0
        cpu, wall, start_up = clock._cpu, clock._wall, [0.0]
        monkeypatch.setattr(clock, "_cpu", lambda: cpu() + start_up[0])
        monkeypatch.setattr(clock, "_wall", lambda: wall() + start_up[0])

        def slow_build(exp):  # the start-up's seconds pass after the command began
            start_up[0] += start_up_s
            return build(exp)

        monkeypatch.setattr(texture_runs, "build_model", slow_build)
        assert main(["train", "--dataset", "2spirals", "--minutes", "0.5", "--no-progress",
                     "--val-every", "end", "--run-dir", str(tmp_path / name)]) == 0  # fmt: skip
        return int(re.search(r"reached at iteration (\d+)", capsys.readouterr().out)[1])

    assert steps("free", 0.0) - steps("charged", 12.0) == 15  # 15 steps of 0.8 s fewer


def test_train_data_announces_or_skips_its_final_evaluation(tmp_path, fixed_pace, capsys):
    # catches: a final test evaluation that overruns --minutes without a word, or one that is
    # skipped although it fits, or priced at the wrong cost per cloud
    rng = np.random.default_rng(0)
    np.save(tmp_path / "clouds.npy", rng.standard_normal((40, 4, 2)))
    argv = ["train", "--data", str(tmp_path / "clouds.npy"), "--minutes", "0.5",
            "--no-progress", "--atol", "1e-3", "--rtol", "1e-3", "--run-dir"]  # fmt: skip
    fixed_pace(0.8, validation=20.0)  # a validation of the 4 val clouds: 20 s, 5 s a cloud
    assert main([*argv, str(tmp_path / "slow")]) == 0
    out = capsys.readouterr().out
    # 4 test clouds and 4 samples at a tenth of a cloud's cost: 22 s, beyond what is left
    # (the budget's quarter, 7.5 s, at most): skipped, with its estimate and the command to run
    assert "skipped the evaluation of 4 test clouds and 4 samples: about 0.37 cpu min" in out
    assert f"grassflow eval {tmp_path / 'slow'}" in out
    assert not (tmp_path / "slow" / "eval.json").exists()
    fixed_pace(0.8, validation=0.0)
    assert main([*argv, str(tmp_path / "fast")]) == 0
    out = capsys.readouterr().out
    assert "evaluating 4 test clouds and 4 samples: about 0.00 cpu min" in out
    assert "test NLL" in out and (tmp_path / "fast" / "eval.json").exists()
